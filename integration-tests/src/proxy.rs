//! A TCP proxy between an agent and the manager that a test can hold and cut, as a network
//! does: what the agent writes while the proxy holds stays in the proxy, and is lost with the
//! connection when the proxy cuts it. The agent's session has then written a message the
//! manager never got, which is what acknowledgements are for.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy: listens on 127.0.0.1, forwards every connection to one target.
pub struct Proxy {
    /// Where agents connect.
    pub addr: SocketAddr,
    /// True while the agent-to-manager direction is held.
    hold: watch::Sender<bool>,
    /// Bumped by every cut: connections from before it end.
    cuts: watch::Sender<u64>,
    /// What the held direction read and did not forward, since the last cut.
    held: Arc<Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding to `target`.
    pub async fn start(target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (hold, _) = watch::channel(false);
        let (cuts, _) = watch::channel(0u64);
        let held = Arc::new(Mutex::new(Vec::new()));
        let (h, c, kept) = (hold.clone(), cuts.clone(), held.clone());
        let task = tokio::spawn(async move {
            while let Ok((agent, _)) = listener.accept().await {
                let Ok(manager) = TcpStream::connect(target).await else {
                    continue;
                };
                let _ = agent.set_nodelay(true);
                let _ = manager.set_nodelay(true);
                tokio::spawn(forward(
                    agent,
                    manager,
                    h.subscribe(),
                    c.subscribe(),
                    kept.clone(),
                ));
            }
        });
        Ok(Self {
            addr,
            hold,
            cuts,
            held,
            task,
        })
    }

    /// `http://` address for agents.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, what agents write is read and kept here, not forwarded.
    pub fn hold(&self) {
        self.hold.send_replace(true);
    }

    /// Whether the bytes held since the last cut contain `needle`.
    pub fn holds(&self, needle: &[u8]) -> bool {
        let held = self.held.lock().expect("not poisoned");
        held.windows(needle.len()).any(|w| w == needle)
    }

    /// Drops every connection, and what was held with them; new ones are forwarded again.
    pub fn cut(&self) {
        self.hold.send_replace(false);
        self.cuts.send_modify(|n| *n += 1);
        self.held.lock().expect("not poisoned").clear();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cuts.send_modify(|n| *n += 1);
    }
}

/// Copies both ways until either side closes or the proxy cuts; the agent-to-manager
/// direction keeps what it reads while held.
async fn forward(
    agent: TcpStream,
    manager: TcpStream,
    mut hold: watch::Receiver<bool>,
    mut cuts: watch::Receiver<u64>,
    held: Arc<Mutex<Vec<u8>>>,
) {
    cuts.mark_unchanged();
    let (mut agent_rx, mut agent_tx) = agent.into_split();
    let (mut manager_rx, mut manager_tx) = manager.into_split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match agent_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if *hold.borrow_and_update() {
                held.lock()
                    .expect("not poisoned")
                    .extend_from_slice(&buf[..n]);
                continue;
            }
            if manager_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = tokio::io::copy(&mut manager_rx, &mut agent_tx);
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cuts.changed() => {}
    }
}
