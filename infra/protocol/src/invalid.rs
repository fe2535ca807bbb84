//! Why a config was refused: its own leaf, so that the config and the profile options it
//! holds both name it without naming each other.

/// A config the runner cannot run: which field (a path inside the config, `""` for the
/// whole) and why, in a sentence that names it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidConfig {
    pub field: String,
    pub message: String,
}
