//! [`HeldRefusedPort`]: a refused loopback port no other test can be handed meanwhile.

use std::net::{Ipv4Addr, SocketAddr};

/// A loopback port held by a socket that is bound and never listens: a connect to it is
/// refused (no listener answers the SYN with anything but a reset), and while the value
/// lives the kernel hands the port to no other socket. Unlike
/// [`refused_port`](super::refused_port), whose port is free again at once, it stays
/// refused across a long retry sequence while other tests start servers in parallel.
pub struct HeldRefusedPort {
    _socket: tokio::net::TcpSocket,
    port: u16,
}

impl HeldRefusedPort {
    /// Binds `127.0.0.1:0` without listening.
    pub fn new() -> HeldRefusedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .expect("bind");
        let port = socket.local_addr().expect("addr").port();
        HeldRefusedPort {
            _socket: socket,
            port,
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:{port}{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}
