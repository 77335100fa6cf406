//! `credbroker persons revoke|restore|list`: the person-level stop
//! (`derive::persons`), through the admin socket, or on the store when no
//! instance runs (`online::reach`), calling the same [`crate::derive::ops`]
//! actions.

use std::path::Path;

use crate::accounts::subject::Person;
use crate::derive::ops;
use crate::derive::persons::StopRequest;
use crate::infra::config::Config;

use super::exit::Exit;
use super::online::{reach, Reached};
use super::operator::admin_refusal;
use super::Res;

/// `--person ISS SUB` as a person.
fn person(given: &[String]) -> Result<Person, Box<dyn std::error::Error>> {
    match given {
        [iss, sub] if !iss.is_empty() && !sub.is_empty() => Ok(Person {
            iss: iss.clone(),
            sub: sub.clone(),
        }),
        _ => Err("--person takes the person's issuer and subject: --person ISS SUB".into()),
    }
}

fn answer(reached: Reached) -> Result<Result<(), Exit>, Box<dyn std::error::Error>> {
    match reached {
        Reached::Instance { status: 200, body } => {
            println!("{body}");
            Ok(Ok(()))
        }
        Reached::Instance { status, body } => {
            eprintln!("error: {}", admin_refusal(status, &body));
            Ok(Err(Exit::Failed))
        }
        Reached::Stopped(_) => Ok(Err(Exit::Unknown)),
    }
}

/// `credbroker persons revoke --person ISS SUB [--reason R]
/// [--revoke-at-providers]`.
pub(super) async fn revoke(
    config: &Path,
    given: &[String],
    reason: Option<String>,
    revoke_at_providers: bool,
) -> Res {
    let cfg = Config::load(config)?;
    let p = person(given)?;
    let body = serde_json::json!({
        "person_iss": p.iss,
        "person_sub": p.sub,
        "reason": reason,
        "revoke_at_providers": revoke_at_providers,
    })
    .to_string();
    match reach(&cfg, "POST", "/persons/revoke", &body).await? {
        Reached::Stopped(off) => {
            let req = StopRequest::manual(
                p,
                reason,
                revoke_at_providers || cfg.revocation.revoke_at_providers,
            );
            let done = ops::revoke_person(off.target(), off.recorder(), req).await?;
            let mut v = serde_json::json!(done);
            v["running"] = false.into();
            println!("{v}");
            if done.stop.revoke_at_providers {
                eprintln!(
                    "the stop is stored, but no instance runs to revoke the person's accounts at their providers: run this command again once one runs"
                );
                return Ok(Exit::Unfinished);
            }
            Ok(Exit::Ok)
        }
        other => Ok(answer(other)?.err().unwrap_or(Exit::Ok)),
    }
}

/// `credbroker persons restore --person ISS SUB`.
pub(super) async fn restore(config: &Path, given: &[String]) -> Res {
    let cfg = Config::load(config)?;
    let p = person(given)?;
    let body = serde_json::json!({"person_iss": p.iss, "person_sub": p.sub}).to_string();
    match reach(&cfg, "POST", "/persons/restore", &body).await? {
        Reached::Stopped(off) => {
            let lifted = ops::restore_person(off.target(), off.recorder(), &p)?;
            println!(
                "{}",
                serde_json::json!({"restored": lifted.is_some(), "stop": lifted, "running": false})
            );
            Ok(Exit::Ok)
        }
        other => Ok(answer(other)?.err().unwrap_or(Exit::Ok)),
    }
}

/// `credbroker persons list`.
pub(super) async fn list(config: &Path) -> Res {
    let cfg = Config::load(config)?;
    match reach(&cfg, "GET", "/persons", "").await? {
        Reached::Stopped(off) => {
            let stops = ops::list_persons(off.target())?;
            println!(
                "{}",
                serde_json::json!({"persons": stops, "running": false})
            );
            Ok(Exit::Ok)
        }
        other => Ok(answer(other)?.err().unwrap_or(Exit::Ok)),
    }
}
