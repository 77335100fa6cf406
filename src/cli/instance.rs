//! Running an instance: `serve` and `quickstart`.

use std::path::Path;
use std::sync::Arc;

use crate::config::Config;

use super::exit::Exit;
use super::Res;

/// `credbroker serve`: serves with a config file until SIGTERM or Ctrl-C.
pub(super) async fn serve(config: &Path) -> Res {
    let cfg = Config::load(config)?;
    let (inst, listeners) = start(&cfg).await?;
    crate::server::run(inst, listeners, crate::server::shutdown_signal()).await?;
    Ok(Exit::Ok)
}

/// Builds the instance and binds its listeners.
async fn start(
    cfg: &Config,
) -> Result<(crate::app::Instance, crate::server::Listeners), crate::app::StartError> {
    let clock: crate::clock::SharedClock = Arc::new(crate::clock::SystemClock);
    // Bind first: a busy port or an unusable socket path fails before the
    // store and the keys exist, and a later failure removes the sockets.
    let listeners = crate::server::bind(cfg).await?;
    let inst = match crate::app::build(cfg.clone(), clock).await {
        Ok(i) => i,
        Err(e) => {
            listeners.abandon();
            return Err(e);
        }
    };
    if let Some(addr) = listeners.public.as_ref().and_then(|l| l.local_addr().ok()) {
        tracing::info!(%addr, "public listener bound");
        inst.public_addr.set(addr).ok();
    }
    Ok((inst, listeners))
}

/// `credbroker quickstart`: writes the quick-start directory (unless it
/// exists), prints the next steps, and serves from it.
pub(super) async fn quickstart(dir: &Path, listen: &str) -> Res {
    let config = super::quickstart::quickstart_files(dir, listen)?;
    let cfg = Config::load(&config)?;
    let (inst, listeners) = start(&cfg).await?;
    let d = dir.display();
    let sock = cfg.socket.path.display();
    eprintln!(
        r#"
credbroker quick start (development only: plain HTTP on loopback, dev issuer)
  config   {config}
  socket   {sock}
  issuer   {issuer}   (metadata: {issuer}/.well-known/oauth-authorization-server)

Next steps, in another terminal:
  TOKEN=$(credbroker subject-token --dir {d} --sub alice)
  credbroker derive --socket {sock} --issuer {issuer} --subject-token "$TOKEN" \
      --step summarize --tool notes.read --resource http://127.0.0.1:9090/notes
  # a sensitive tool outside its step is denied:
  credbroker derive --socket {sock} --issuer {issuer} --subject-token "$TOKEN" \
      --step summarize --tool notes.delete --resource http://127.0.0.1:9090/notes

Pages (connect links, your accounts): {issuer}/account
  # a local account alice is the same person as subject tokens with sub alice:
  credbroker users add alice --config {config}
  (plain HTTP on loopback: the session cookie is the development cookie
  "credbroker-dev" instead of "__Host-credbroker", which needs https)
"#,
        config = config.display(),
        issuer = cfg.issuer,
    );
    crate::server::run(inst, listeners, crate::server::shutdown_signal()).await?;
    Ok(Exit::Ok)
}
