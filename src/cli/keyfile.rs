//! Key files: PKCS#8 PEM, mode 0600 (read and written through the config's
//! secret-file helpers, which check the mode).

use std::path::{Path, PathBuf};

use crate::base::jose::Es256Key;
use crate::infra::config::{read_secret_file, write_secret_file};

/// PKCS#8 DER as PEM.
pub fn pem_pkcs8(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut s = String::from("-----BEGIN PRIVATE KEY-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("-----END PRIVATE KEY-----\n");
    s
}

/// Loads an ES256 key from a PKCS#8 PEM file of mode 0600.
pub fn load_pem_key(path: &Path) -> Result<Es256Key, Box<dyn std::error::Error>> {
    use rustls_pki_types::pem::PemObject;
    let pem = read_secret_file(path).map_err(|e| format!("key file {}: {e}", path.display()))?;
    let der = rustls_pki_types::PrivatePkcs8KeyDer::from_pem_slice(pem.expose())
        .map_err(|_| format!("{}: not a PKCS#8 PEM private key", path.display()))?;
    Ok(Es256Key::from_pkcs8(der.secret_pkcs8_der())?)
}

/// A fresh file name for a new DPoP key in the current directory.
fn new_key_path() -> std::io::Result<PathBuf> {
    let mut r = [0u8; 6];
    aws_lc_rs::rand::fill(&mut r).map_err(|_| std::io::Error::other("random"))?;
    let dir = std::env::current_dir()?;
    Ok(dir.join(format!("dpop-key-{}.pem", hex::encode(r))))
}

/// The tool's DPoP key for `derive`: loaded from `path` if it exists, else
/// made and saved there; with no path, made and saved to a new file whose
/// path is printed.
pub(super) fn dpop_key(path: Option<PathBuf>) -> Result<Es256Key, Box<dyn std::error::Error>> {
    if let Some(p) = path.as_ref().filter(|p| p.exists()) {
        return load_pem_key(p);
    }
    let (key, pkcs8) = Es256Key::generate()?;
    match path {
        Some(p) => {
            write_secret_file(&p, pem_pkcs8(pkcs8.expose()).as_bytes())
                .map_err(|e| format!("new DPoP key file {}: {e}", p.display()))?;
            eprintln!("new DPoP key saved to {} (mode 0600)", p.display());
        }
        None => {
            let p = new_key_path()?;
            write_secret_file(&p, pem_pkcs8(pkcs8.expose()).as_bytes())
                .map_err(|e| format!("new DPoP key file {}: {e}", p.display()))?;
            eprintln!(
                "new DPoP key saved to {} (pass it to the tool with the token)",
                p.display()
            );
        }
    }
    Ok(key)
}
