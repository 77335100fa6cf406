//! The exit codes, by name. [`HELP`] is what `--help` says about them; a
//! test keeps the two in step.

use std::process::ExitCode;

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Done (for `status`: running and ready).
    Ok = 0,
    /// Failed, or the instance refused the command (for `status`: running
    /// but not ready; for `accounts disconnect`: nothing was deleted).
    Failed = 1,
    /// `derive`: the broker refused the token (its answer is printed).
    Refused = 2,
    /// `status`: no instance runs.
    NotRunning = 3,
    /// `keys rotate-vault`: not finished; run it again to resume.
    Unfinished = 4,
    /// `accounts list`: some records do not decrypt (they are listed).
    Unreadable = 5,
    /// `status`: cannot tell whether an instance runs, and the message
    /// says why (the config does not load, or the command runs as another
    /// user than the broker's).
    Unknown = 6,
}

impl Exit {
    /// `Ok` when `done`, else `otherwise`.
    pub fn ok_if(done: bool, otherwise: Exit) -> Exit {
        if done {
            Exit::Ok
        } else {
            otherwise
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

/// The exit codes as `--help` lists them.
pub(super) const HELP: &str = "\
Exit codes:
  0  done (status: running and ready)
  1  failed, or refused by the instance (status: running but not ready; accounts disconnect: nothing deleted)
  2  derive: the broker refused the token
  3  status: no instance runs
  4  keys rotate-vault: not finished, run it again to resume
  5  accounts list: some records do not decrypt
  6  status: cannot tell (the config does not load, or another user than the broker's runs it)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_every_exit_code_by_its_number() {
        for e in [
            Exit::Ok,
            Exit::Failed,
            Exit::Refused,
            Exit::NotRunning,
            Exit::Unfinished,
            Exit::Unreadable,
            Exit::Unknown,
        ] {
            assert!(
                HELP.contains(&format!("\n  {}  ", e as u8)),
                "{e:?} is not in --help"
            );
        }
    }
}
