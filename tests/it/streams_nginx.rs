//! Server-sent events through a real reverse proxy: Debian's nginx in front of the
//! loopback origin of `support::sse`, `proxy_buffering off` (as an SSE deployment sets
//! it). The origin cuts a stream mid-event; nginx then ends its own response to the
//! client unfinished, and the stream resumes from the latest id. Real clock (nginx is a
//! process); skipped without nginx, a failure under `CI=true` (see `support::nginx`).

use crate::support;

use std::time::Duration;

use futures_util::StreamExt;
use reqwest_resilience::stream::{EventStream, ReconnectCause, ReconnectPolicy, StreamItem};
use reqwest_resilience::{Jitter, Resilience};
use support::nginx::Nginx;
use support::sse::{SseServer, Step};

fn event(id: u32) -> String {
    format!("id: {id}\ndata: event {id}\n\n")
}

fn proxy_config(dir: &std::path::Path, port: u16, origin: std::net::SocketAddr) -> String {
    let d = dir.display();
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://{origin};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_cache off;
        }}
    }}
}}
"#
    )
}

#[tokio::test]
async fn through_nginx_a_stream_cut_mid_event_resumes_from_the_latest_id() {
    let origin = SseServer::start(|i, seen| {
        let from: u32 = seen
            .last_event_id
            .as_deref()
            .map_or(0, |id| id.parse().unwrap());
        match i {
            0 => vec![
                Step::ok(),
                Step::send(&(event(1) + &event(2))),
                Step::send("id: 3\ndata: event 3 first half\n"),
                Step::Wait(Duration::from_millis(50)),
                Step::Cut,
            ],
            1 => vec![
                Step::ok(),
                Step::send(&((from + 1..=5).map(event).collect::<String>())),
                Step::End,
            ],
            _ => vec![Step::Head(204, vec![])],
        }
    })
    .await;
    let addr = origin.addr();
    let Some(nginx) = Nginx::start_with(|dir, port| proxy_config(dir, port, addr)) else {
        return;
    };
    let client = Resilience::new()
        .build(reqwest::Client::builder().no_proxy().build().unwrap())
        .unwrap();
    let policy = ReconnectPolicy::new()
        .jitter(Jitter::None)
        .floor(Duration::from_millis(50))
        .reconnection_time(Duration::from_millis(100));
    let mut stream = EventStream::new(client.get(nginx.url("/feed")))
        .unwrap()
        .reconnect_policy(policy)
        .unwrap();
    let mut data = Vec::new();
    let mut causes = Vec::new();
    while let Some(item) = tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .expect("the stream moves on within 20 s")
    {
        match item.unwrap() {
            StreamItem::Event(e) => data.push((e.id, e.data)),
            StreamItem::Reconnecting(r) => causes.push(r.cause),
            _ => {}
        }
    }
    let want: Vec<(String, String)> = (1..=5)
        .map(|i| (i.to_string(), format!("event {i}")))
        .collect();
    assert_eq!(data, want, "nothing lost, nothing twice");
    assert_eq!(causes, [ReconnectCause::Cut, ReconnectCause::Ended]);
    assert_eq!(
        origin.last_event_ids(),
        [None, Some("2".into()), Some("5".into())]
    );
}
