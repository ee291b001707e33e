//! Known real bugs, re-created at their exact spot (feature `mutants`, off by default).
//!
//! Each variant names one bug from the reviews of kandev #3636 and compozy #454 (or, for
//! the few not [`Mutant::in_core`], a bug of the engine's reading of the wire). With a
//! mutant active the core (or [`crate::classify`], or [`crate::delivery`], or the engine
//! that drives the core) behaves as the buggy code did; the tests, the sim and the fuzzer
//! must each catch every one of the core's, the sim every one. Without
//! the feature this module holds only [`ActiveMutant`], a zero-sized type whose checks
//! are constant `false`, so a production build contains none of the buggy paths.

use serde::{Deserialize, Serialize};

/// One re-created bug.
#[cfg(feature = "mutants")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Mutant {
    /// A very late callback of an evicted cancelled attempt is accepted as legacy traffic,
    /// and the legacy path acts on the session's current runtime: a ready callback of the
    /// evicted attempt dispatches the waiting turn to the replacement's runtime before that
    /// runtime is ready (kandev #3636: a delayed callback mutates the replacement execution).
    TombstoneEvictionReopens,
    /// A replacement startup slips between a callback's validation and its effects.
    ToctouGeneration,
    /// "…not found…" anywhere in a load error message triggers `session/new`.
    SubstringFallback,
    /// A load timeout replaces the conversation with `session/new`.
    TimeoutFallback,
    /// An early exit after claiming a prompt leaves it claimed.
    ClaimNotRolledBack,
    /// A cancelled attempt stops an execution its successor reused.
    OldAttemptStopsSuccessor,
    /// A late `agent_ready` of a cancelled attempt dispatches its stale prompt.
    StaleCallbackDispatches,
    /// An old stored failure hides a new one.
    HistoricalErrorSuppresses,
    /// `recovery_exhausted` is recorded twice in one turn: by the failed replacement's path
    /// and again by the turn's recovery path.
    ExhaustedTwice,
    /// A re-prompt wraps the previous, already-wrapped request, so replay blocks pile up.
    DoubleReplayBlock,
    /// The notification queue closes the connection when full.
    QueueOverflowCloses,
    /// A teardown that hangs holds the session forever.
    CleanupWithoutDeadline,
    /// Cancelling after the provider accepted tears the runtime down.
    CancelAfterAcceptTearsDown,
    /// A joiner waits forever on a hung attempt.
    UnboundedJoinWait,
    /// A "not found" load answer replaces a conversation the agent's own `session/list`
    /// still has (issue 13: claude-agent-acp 0.23's early subprocess exit).
    ListedConversationReplaced,
    /// A recovery re-prompt tells the agent to continue after one event fewer than the
    /// client already has, so the replacement repeats output the client already got.
    ReplayRepeatsDelivered,
    /// The push that fills the notification queue (backpressure starts) numbers the next
    /// item in advance and loses that number, so the client sees a gap after backpressure.
    BackpressureSkipsSeq,
    /// An inconclusive load failure (a timeout, an internal error) throws the session's
    /// conversation identity away, so the next resume starts a new conversation.
    InconclusiveLoadDropsToken,
    /// A new recovery failure is raised under the stored failure's attempt, so the attempt
    /// that really failed is never named to the client.
    FailureKeepsOldAttempt,
    /// The busy check looks only at a dispatched turn: a second prompt while the first
    /// still waits for its runtime is claimed over it, and the first never ends.
    PromptClaimedTwice,
    /// An accepted turn whose agent went silent (no update, no answer) is never given up:
    /// no idle deadline is armed, so the turn hangs on a wedged runtime instead of being
    /// cancelled, stopped and recovered (xenodium/agent-shell #741, issue 27).
    IdleDeadlineIgnored,
    /// Every recovery re-prompt's replay block restates the first recovery's generation
    /// (a block kept from the turn's first re-prompt), so from the second recovery on the
    /// agent is told it continues a run it was already told about: it works from a stale
    /// context (compozy #454's class; issue 29, item 2).
    ReplayGenerationStale,
    /// Not the core's: the engine reads a `session/update`'s members with a hand-written
    /// string scanner instead of serde, and the scanner takes every `\"` for an escaped
    /// quote, even the closing quote after an escaped backslash (`"C:\\Users\\"` ends in
    /// `\\"`): a string that ends in a backslash (a Windows path, a regex) runs on past its
    /// end, the update reads as malformed, and the turn's output event reaches the client
    /// as `null` (issue 29, class 5: wire content the simulated agents never wrote). Lives
    /// in `palisade-engine` (`events::UpdateParams::scanned`), switched by this enum like
    /// the rest; see [`Mutant::in_core`].
    UpdateScanMisreadsEscapes,
    /// Not the core's: the engine's restore leaves a live attempt that had no runtime
    /// bound (its spawn was in flight when the previous incarnation died) unstarted,
    /// taking the core to ask for its runtime again as it does for the attempts it starts
    /// after the restore. The attempt then waits for its start deadline, fails it, and
    /// recovery completes the turn: liveness holds, but the client was shown a failure no
    /// fault caused (issue 29, class 4: recovery that works for the wrong reason). Lives
    /// in `palisade-engine` (`Engine::restore_prepared`); see [`Mutant::in_core`].
    RestoreLeavesSpawnUnstarted,
    /// Not the core's: the engine's restore counts the first event the state lists
    /// undelivered as delivered (taking it for the one the previous incarnation was writing
    /// to its caller when it died, so as not to show it twice), and hands out the rest:
    /// `delivered through` restored off by one, so an event the caller never took is never
    /// shown (issue 29, class 6: across restarts none is missing). Lives in
    /// `palisade-engine` (`Engine::restore_prepared`); see [`Mutant::in_core`].
    RestoreSkipsFirstUndelivered,
    /// Not the core's: the engine ignores the room its caller has (what
    /// `Engine::set_caller_room` is told) and hands out every event as if the caller's
    /// channel always had room, so a shell that cannot queue more for a slow caller drops
    /// what does not fit (issue 29, class 3: a supervisor that drops events for a slow
    /// caller; the hand edit `reports/regressions/found/caller-behind-gets-every-event.json`
    /// was recorded against). Lives in `palisade-engine`; see [`Mutant::in_core`].
    CallerRoomIgnored,
    /// A restored core keeps minting attempt IDs in the snapshot's epoch, its sequence
    /// starting again at 1: a restart reuses the previous incarnation's attempt IDs, so a
    /// late callback of a runtime that outlived the orchestrator (kandev's agentctl
    /// sidecar) passes for the new attempt's (issue 29, class 1: identity across restarts).
    RestoreReusesAttemptIds,
    /// Not the core's: the engine's state image lists a session's delivery queue before
    /// the coalescer's open batch, although the batch left the queue first (lower seqs),
    /// so a crash while the caller is behind with output queued *and* a batch open
    /// restores them out of order (issue 29, class 3: an edge the load reached in no
    /// seed). Lives in `palisade-engine`; see [`Mutant::in_core`].
    ImageListsQueueBeforeBatch,
    /// Not the core's: a restored engine forgets its execution counter and numbers its
    /// runtimes from 1 again, so on a platform whose runtimes outlive the orchestrator (a
    /// sidecar) a new runtime takes the ID of one that still runs, and that one's late
    /// updates, answers and exit pass for the new one's (issue 29, class 1: identity
    /// across restarts; kandev's agentctl). Lives in `palisade-engine`; see
    /// [`Mutant::in_core`].
    RestoreReusesExecutionIds,
    /// Not the core's: a restored engine leaves its previous incarnation's runtimes to
    /// whoever runs them, so on a platform whose runtimes outlive the orchestrator they
    /// run on, serving no one (rule 5's cleanup ownership across a restart). Lives in
    /// `palisade-engine`; see [`Mutant::in_core`].
    RestoreLeavesSurvivorsRunning,
}

#[cfg(feature = "mutants")]
impl Mutant {
    /// Every mutant, in a fixed order.
    pub const ALL: [Mutant; 30] = [
        Mutant::TombstoneEvictionReopens,
        Mutant::ToctouGeneration,
        Mutant::SubstringFallback,
        Mutant::TimeoutFallback,
        Mutant::ClaimNotRolledBack,
        Mutant::OldAttemptStopsSuccessor,
        Mutant::StaleCallbackDispatches,
        Mutant::HistoricalErrorSuppresses,
        Mutant::ExhaustedTwice,
        Mutant::DoubleReplayBlock,
        Mutant::QueueOverflowCloses,
        Mutant::CleanupWithoutDeadline,
        Mutant::CancelAfterAcceptTearsDown,
        Mutant::UnboundedJoinWait,
        Mutant::ListedConversationReplaced,
        Mutant::ReplayRepeatsDelivered,
        Mutant::BackpressureSkipsSeq,
        Mutant::InconclusiveLoadDropsToken,
        Mutant::FailureKeepsOldAttempt,
        Mutant::PromptClaimedTwice,
        Mutant::IdleDeadlineIgnored,
        Mutant::ReplayGenerationStale,
        Mutant::UpdateScanMisreadsEscapes,
        Mutant::RestoreLeavesSpawnUnstarted,
        Mutant::RestoreSkipsFirstUndelivered,
        Mutant::CallerRoomIgnored,
        Mutant::RestoreReusesAttemptIds,
        Mutant::ImageListsQueueBeforeBatch,
        Mutant::RestoreReusesExecutionIds,
        Mutant::RestoreLeavesSurvivorsRunning,
    ];

    /// The kebab-case name used on the command line and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Mutant::TombstoneEvictionReopens => "tombstone-eviction-reopens",
            Mutant::ToctouGeneration => "toctou-generation",
            Mutant::SubstringFallback => "substring-fallback",
            Mutant::TimeoutFallback => "timeout-fallback",
            Mutant::ClaimNotRolledBack => "claim-not-rolled-back",
            Mutant::OldAttemptStopsSuccessor => "old-attempt-stops-successor",
            Mutant::StaleCallbackDispatches => "stale-callback-dispatches",
            Mutant::HistoricalErrorSuppresses => "historical-error-suppresses",
            Mutant::ExhaustedTwice => "exhausted-twice",
            Mutant::DoubleReplayBlock => "double-replay-block",
            Mutant::QueueOverflowCloses => "queue-overflow-closes",
            Mutant::CleanupWithoutDeadline => "cleanup-without-deadline",
            Mutant::CancelAfterAcceptTearsDown => "cancel-after-accept-tears-down",
            Mutant::UnboundedJoinWait => "unbounded-join-wait",
            Mutant::ListedConversationReplaced => "listed-conversation-replaced",
            Mutant::ReplayRepeatsDelivered => "replay-repeats-delivered",
            Mutant::BackpressureSkipsSeq => "backpressure-skips-seq",
            Mutant::InconclusiveLoadDropsToken => "inconclusive-load-drops-token",
            Mutant::FailureKeepsOldAttempt => "failure-keeps-old-attempt",
            Mutant::PromptClaimedTwice => "prompt-claimed-twice",
            Mutant::IdleDeadlineIgnored => "idle-deadline-ignored",
            Mutant::ReplayGenerationStale => "replay-generation-stale",
            Mutant::UpdateScanMisreadsEscapes => "update-scan-misreads-escapes",
            Mutant::RestoreLeavesSpawnUnstarted => "restore-leaves-spawn-unstarted",
            Mutant::RestoreSkipsFirstUndelivered => "restore-skips-first-undelivered",
            Mutant::CallerRoomIgnored => "caller-room-ignored",
            Mutant::RestoreReusesAttemptIds => "restore-reuses-attempt-ids",
            Mutant::ImageListsQueueBeforeBatch => "image-lists-queue-before-batch",
            Mutant::RestoreReusesExecutionIds => "restore-reuses-execution-ids",
            Mutant::RestoreLeavesSurvivorsRunning => "restore-leaves-survivors-running",
        }
    }

    /// Whether the bug lives in the core (or its classifier or delivery) rather than in
    /// the engine (its reading of the wire, its restore): only those reach the core's own
    /// tests and fuzz targets, which never read JSON nor restore an engine. The others are
    /// caught by the simulator's sweep.
    pub const fn in_core(self) -> bool {
        !matches!(
            self,
            Mutant::UpdateScanMisreadsEscapes
                | Mutant::RestoreLeavesSpawnUnstarted
                | Mutant::RestoreSkipsFirstUndelivered
                | Mutant::CallerRoomIgnored
                | Mutant::ImageListsQueueBeforeBatch
                | Mutant::RestoreReusesExecutionIds
                | Mutant::RestoreLeavesSurvivorsRunning
        )
    }

    /// Parses a kebab-case name.
    pub fn from_name(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Which mutant, if any, is active. Zero-sized and always inactive without the feature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveMutant(#[cfg(feature = "mutants")] Option<Mutant>);

impl ActiveMutant {
    /// No mutant: the real core.
    pub const NONE: ActiveMutant = ActiveMutant(
        #[cfg(feature = "mutants")]
        None,
    );

    /// Activates `mutant`.
    #[cfg(feature = "mutants")]
    pub const fn on(mutant: Mutant) -> Self {
        ActiveMutant(Some(mutant))
    }

    /// The active mutant.
    #[cfg(feature = "mutants")]
    pub const fn get(self) -> Option<Mutant> {
        self.0
    }
}

/// `mutant_on!(active, Variant)`: true when that mutant is active; a constant `false`
/// without the feature, so the buggy branch is compiled out.
macro_rules! mutant_on {
    ($active:expr, $variant:ident) => {{
        #[cfg(feature = "mutants")]
        let on = $active.get() == Some($crate::mutants::Mutant::$variant);
        #[cfg(not(feature = "mutants"))]
        let on = {
            let _ = &$active;
            false
        };
        on
    }};
}
pub(crate) use mutant_on;
