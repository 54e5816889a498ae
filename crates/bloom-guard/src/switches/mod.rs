//! Switches: the values an operator switches at run time. The mode
//! (`mode`) and the mode and audit rate in three layers, with who set each
//! (`settings`). Imports nothing above it: `report/` shows these values,
//! `control/` stores and serves them.

pub(crate) mod mode;
pub(crate) mod settings;
