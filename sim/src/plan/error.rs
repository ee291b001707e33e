//! Why a plan cannot run against its scenario (its faults, its configuration, its
//! environment): where, as a JSON path into the failure file, and what.

/// Why a plan cannot run against its scenario: the JSON path of the offending value in
/// the failure file (`plan.faults[3].session`) and what is wrong, with the bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError {
    /// Where, as a JSON path from the failure file's root.
    pub path: String,
    /// What, with the bound.
    pub message: String,
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}
