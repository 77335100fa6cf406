//! Interoperability with independent implementations: npm `jose` and a real
//! IdP's subject tokens.
mod idp_subject_tokens;
mod jose;
mod subject_status;
mod vectors;
