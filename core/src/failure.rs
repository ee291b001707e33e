//! Rule 10, failure identity: a stored recovery failure suppresses a new one only if every
//! field of its identity matches and the user has not dismissed it. A historical error
//! never hides a new failure.

use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, ErrorStamp, ExecutionId};
use crate::io::RecoveryFailure;
use crate::mutants::{mutant_on, ActiveMutant};

/// The session's last reported failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredFailure {
    pub(crate) failure: RecoveryFailure,
    pub(crate) dismissed: bool,
}

/// The failure of `attempt` (on `execution`, stamped `stamp`) if it must be reported given
/// what is stored; the store then holds it.
pub(crate) fn report(
    stored: &mut Option<StoredFailure>,
    attempt: AttemptId,
    execution: Option<ExecutionId>,
    stamp: ErrorStamp,
    mutant: ActiveMutant,
) -> Option<RecoveryFailure> {
    let attempt = match *stored {
        // The bug: the new failure is raised under the stored failure's attempt.
        Some(old) if mutant_on!(mutant, FailureKeepsOldAttempt) => old.failure.attempt,
        _ => attempt,
    };
    let failure = RecoveryFailure {
        attempt,
        execution,
        stamp,
    };
    should_report(stored, failure, mutant).then_some(failure)
}

/// The user dismissed the stored failure; false if there is none left to dismiss.
pub(crate) fn dismiss(stored: &mut Option<StoredFailure>) -> bool {
    match stored.as_mut() {
        Some(f) if !f.dismissed => {
            f.dismissed = true;
            true
        }
        _ => false,
    }
}

/// Whether `new` must be reported given what is stored, and updates the store.
pub(crate) fn should_report(
    stored: &mut Option<StoredFailure>,
    new: RecoveryFailure,
    mutant: ActiveMutant,
) -> bool {
    if let Some(s) = stored {
        if !s.dismissed && (s.failure == new || mutant_on!(mutant, HistoricalErrorSuppresses)) {
            return false;
        }
    }
    *stored = Some(StoredFailure {
        failure: new,
        dismissed: false,
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{AttemptId, Epoch, ErrorStamp, ExecutionId};

    fn failure(attempt: u64, exec: u64, stamp: u64) -> RecoveryFailure {
        RecoveryFailure {
            attempt: AttemptId::new(Epoch::FIRST, attempt).unwrap(),
            execution: ExecutionId::new(exec),
            stamp: ErrorStamp::new(stamp).unwrap(),
        }
    }

    #[test]
    fn identical_undismissed_failure_is_suppressed() {
        let mut stored = None;
        assert!(should_report(
            &mut stored,
            failure(1, 1, 1),
            ActiveMutant::NONE
        ));
        assert!(!should_report(
            &mut stored,
            failure(1, 1, 1),
            ActiveMutant::NONE
        ));
    }

    #[test]
    fn historical_error_never_hides_a_new_failure() {
        for new in [
            failure(2, 1, 1),
            failure(1, 2, 1),
            failure(1, 1, 2),
            failure(1, 0, 1),
        ] {
            let mut stored = None;
            assert!(should_report(
                &mut stored,
                failure(1, 1, 1),
                ActiveMutant::NONE
            ));
            assert!(
                should_report(&mut stored, new, ActiveMutant::NONE),
                "{new:?}"
            );
        }
    }

    #[test]
    fn dismissed_failure_suppresses_nothing() {
        let mut stored = None;
        assert!(should_report(
            &mut stored,
            failure(1, 1, 1),
            ActiveMutant::NONE
        ));
        stored.as_mut().unwrap().dismissed = true;
        assert!(should_report(
            &mut stored,
            failure(1, 1, 1),
            ActiveMutant::NONE
        ));
    }

    #[cfg(feature = "mutants")]
    #[test]
    fn mutant_historical_error_suppresses_is_caught() {
        use crate::mutants::Mutant;
        let m = ActiveMutant::on(Mutant::HistoricalErrorSuppresses);
        let mut stored = None;
        assert!(should_report(&mut stored, failure(1, 1, 1), m));
        assert!(
            !should_report(&mut stored, failure(2, 1, 7), m),
            "the mutant hides the new failure"
        );
    }
}
