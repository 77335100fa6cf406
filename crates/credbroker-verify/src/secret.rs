//! `Secret<T>`: a value that must never reach a log, a metric, an event, an
//! error page or a panic message.
//!
//! It has no `Display`, no `Serialize`, and its `Debug` prints `[REDACTED]`.
//! The inner value is zeroized on drop. [`Secret::expose`] is the only way in,
//! so every place that reads a secret is easy to find with grep. (The
//! broker adds reading a secret file, mode 0600, beside it.)

use std::fmt;
use zeroize::Zeroize;

/// A secret value: redacted in `Debug`, zeroized on drop.
pub struct Secret<T: Zeroize>(T);

impl<T: Zeroize> Secret<T> {
    /// Wraps a value.
    pub fn new(value: T) -> Self {
        Secret(value)
    }

    /// The only way to read the secret.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T: Zeroize + Clone> Clone for Secret<T> {
    fn clone(&self) -> Self {
        Secret(self.0.clone())
    }
}

impl<T: Zeroize> Drop for Secret<T> {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl<T: Zeroize> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

impl<T: Zeroize> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Secret(value)
    }
}

/// A secret string (tokens, codes, passwords).
pub type SecretString = Secret<String>;
/// Secret bytes (keys).
pub type SecretBytes = Secret<Vec<u8>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_redacted() {
        let s = SecretString::new("canary-7f3a".into());
        assert_eq!(format!("{s:?}"), "[REDACTED]");
        assert_eq!(s.expose(), "canary-7f3a");
    }
}
