//! TCP backends and load for `bench/tcp.sh`: what HAProxy `mode tcp`, nginx `stream`
//! and `drover proxy --tcp` are measured with, side by side.
//!
//! ```text
//! testkit-tcp serve ADDR                     # echo + source server (below)
//! testkit-tcp bulk ADDR CONNS TOTAL_BYTES    # TOTAL_BYTES from the server over CONNS connections
//! testkit-tcp short ADDR CONCURRENCY SECONDS # connect, 100 bytes each way, close; as many as it can
//! ```
//!
//! The server reads the first byte of a connection: `e` echoes everything after it back
//! until the client finishes sending; `s` is followed by 8 bytes (big-endian) and sends
//! that many bytes, then closes. `bulk` and `short` print one JSON line: bytes, seconds
//! and bytes/s; connections, errors and connections/s.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What `short` sends and expects back on each connection.
const SHORT_BYTES: usize = 100;

/// A source writes in chunks of this size.
const CHUNK: usize = 256 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: testkit-tcp serve ADDR | bulk ADDR CONNS TOTAL_BYTES | short ADDR CONCURRENCY SECONDS";
    let arg = |i: usize| -> &str {
        args.get(i)
            .map(String::as_str)
            .unwrap_or_else(|| fail(usage))
    };
    let addr: SocketAddr = arg(1)
        .parse()
        .unwrap_or_else(|_| fail("ADDR must be IP:PORT"));
    let number = |i: usize| -> u64 { arg(i).parse().unwrap_or_else(|_| fail(usage)) };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match arg(0) {
        "serve" => runtime.block_on(serve(addr)),
        "bulk" => runtime.block_on(bulk(addr, number(2), number(3))),
        "short" => runtime.block_on(short(addr, number(2), number(3))),
        _ => fail(usage),
    }
}

fn fail(why: &str) -> ! {
    eprintln!("testkit-tcp: {why}");
    std::process::exit(2)
}

async fn serve(addr: SocketAddr) {
    let listener = TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| fail(&format!("cannot listen on {addr}: {e}")));
    // The ready line, on stdout as testkit-backend's (`spawn_ready_line` waits for it).
    println!(
        "testkit-tcp listening on {}",
        listener.local_addr().unwrap()
    );
    loop {
        let Ok((s, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let _ = s.set_nodelay(true);
            let _ = one(s).await;
        });
    }
}

async fn one(mut s: TcpStream) -> std::io::Result<()> {
    let mut kind = [0u8; 1];
    s.read_exact(&mut kind).await?;
    match kind[0] {
        b'e' => {
            let (mut r, mut w) = s.split();
            tokio::io::copy(&mut r, &mut w).await?;
            w.shutdown().await
        }
        b's' => {
            let mut len = [0u8; 8];
            s.read_exact(&mut len).await?;
            let mut left = u64::from_be_bytes(len);
            let chunk = vec![b'x'; CHUNK];
            while left > 0 {
                let n = left.min(CHUNK as u64) as usize;
                s.write_all(&chunk[..n]).await?;
                left -= n as u64;
            }
            s.shutdown().await
        }
        _ => Ok(()),
    }
}

async fn bulk(addr: SocketAddr, conns: u64, total: u64) {
    let each = total / conns.max(1);
    let started = Instant::now();
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await?;
                let mut ask = vec![b's'];
                ask.extend_from_slice(&each.to_be_bytes());
                s.write_all(&ask).await?;
                let mut buf = vec![0u8; CHUNK];
                let mut got = 0u64;
                loop {
                    let n = s.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    got += n as u64;
                }
                Ok::<u64, std::io::Error>(got)
            })
        })
        .collect();
    let mut bytes = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(n) => bytes += n,
            Err(e) => fail(&format!("bulk connection failed: {e}")),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if bytes != each * conns {
        fail(&format!("bulk got {bytes} bytes of {}", each * conns));
    }
    println!(
        "{{\"bytes\":{bytes},\"seconds\":{seconds:.4},\"bytes_per_s\":{:.0}}}",
        bytes as f64 / seconds
    );
}

async fn short(addr: SocketAddr, concurrency: u64, seconds: u64) {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (done, errors, stop) = (done.clone(), errors.clone(), stop.clone());
            tokio::spawn(async move {
                let mut message = vec![b'e'];
                message.extend_from_slice(&[b'm'; SHORT_BYTES]);
                let mut back = vec![0u8; SHORT_BYTES];
                while !stop.load(Relaxed) {
                    let r = async {
                        let mut s = TcpStream::connect(addr).await?;
                        s.set_nodelay(true)?;
                        s.write_all(&message).await?;
                        s.read_exact(&mut back).await?;
                        s.shutdown().await?;
                        // The server's end, after ours: the exchange completed.
                        let mut rest = [0u8; 1];
                        match s.read(&mut rest).await? {
                            0 => Ok(()),
                            _ => Err(std::io::Error::other("more bytes than sent")),
                        }
                    };
                    match tokio::time::timeout(Duration::from_secs(10), r).await {
                        Ok(Ok(())) => done.fetch_add(1, Relaxed),
                        _ => errors.fetch_add(1, Relaxed),
                    };
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let n = done.load(Relaxed);
    println!(
        "{{\"connections\":{n},\"errors\":{},\"seconds\":{elapsed:.4},\"connections_per_s\":{:.0}}}",
        errors.load(Relaxed),
        n as f64 / elapsed
    );
}
