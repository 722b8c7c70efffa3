//! Minimal RFC 6455 pieces: the accept key and frame encoding/decoding.
//!
//! SHA-1 and base64 are written out here (about 60 lines) instead of pulling
//! two crates into the shared lock file for one test-only hash.

use crate::http::BufConn;
use std::io;
use tokio::io::{AsyncRead, AsyncWrite};

const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

pub const OP_CONTINUATION: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// Frames larger than this are refused: tests never need more, and it keeps
/// a garbage length from allocating gigabytes.
const MAX_PAYLOAD: u64 = 64 * 1024 * 1024;

/// `Sec-WebSocket-Accept` for a given `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    let mut input = key.trim().as_bytes().to_vec();
    input.extend_from_slice(WS_GUID.as_bytes());
    base64(&sha1(&input))
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub fin: bool,
    pub opcode: u8,
    /// Already unmasked.
    pub payload: Vec<u8>,
}

/// Encodes a frame; `mask` is required for client-to-server frames.
pub fn encode_frame(fin: bool, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    out.push(if fin { 0x80 } else { 0 } | (opcode & 0x0F));
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n <= 0xFFFF => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(key) => {
            out.extend_from_slice(&key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
        None => out.extend_from_slice(payload),
    }
    out
}

/// Reads one frame; `Ok(None)` on a clean EOF between frames.
pub(crate) async fn read_frame<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufConn<S>,
) -> io::Result<Option<Frame>> {
    // Distinguish "peer closed between frames" from a truncated frame.
    if !conn.fill_some().await? {
        return Ok(None);
    }
    let h = conn.read_exact_n(2).await?;
    let fin = h[0] & 0x80 != 0;
    let opcode = h[0] & 0x0F;
    let masked = h[1] & 0x80 != 0;
    let len = match h[1] & 0x7F {
        126 => u16::from_be_bytes(conn.read_exact_n(2).await?.try_into().unwrap_or([0; 2])) as u64,
        127 => u64::from_be_bytes(conn.read_exact_n(8).await?.try_into().unwrap_or([0; 8])),
        n => n as u64,
    };
    if len > MAX_PAYLOAD {
        return Err(crate::http::invalid("websocket frame too large"));
    }
    let key = if masked {
        let k = conn.read_exact_n(4).await?;
        Some([k[0], k[1], k[2], k[3]])
    } else {
        None
    };
    let mut payload = conn.read_exact_n(len as usize).await?;
    if let Some(key) = key {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= key[i % 4];
        }
    }
    Ok(Some(Frame {
        fin,
        opcode,
        payload,
    }))
}

fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A827999),
                20..=39 => (b ^ c ^ d, 0x6ED9EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1BBCDC),
                _ => (b ^ c ^ d, 0xCA62C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (hv, v) in h.iter_mut().zip([a, b, c, d, e]) {
            *hv = hv.wrapping_add(v);
        }
    }
    let mut out = [0u8; 20];
    for (i, v) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&v.to_be_bytes());
    }
    out
}

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for group in data.chunks(3) {
        let n = (group[0] as u32) << 16
            | (*group.get(1).unwrap_or(&0) as u32) << 8
            | *group.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= group.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 0x3F) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc6455_example_accept_key() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn sha1_and_base64_known_values() {
        let hex: String = sha1(b"abc").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "a9993e364706816aba3e25717850c26c9cd0d89d");
        // Two blocks of padding.
        let long = vec![b'a'; 1000];
        let hex: String = sha1(&long).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "291e9a6c66994949b57ba5e650361e98fc36b1ba");
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[tokio::test]
    async fn frame_round_trip_all_lengths() {
        for len in [0usize, 5, 125, 126, 1000, 65535, 65536, 70000] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let bytes = encode_frame(true, OP_BINARY, &payload, Some([1, 2, 3, 4]));
            let (mut a, b) = tokio::io::duplex(1 << 20);
            tokio::io::AsyncWriteExt::write_all(&mut a, &bytes)
                .await
                .unwrap();
            drop(a);
            let mut conn = BufConn::new(b);
            let f = read_frame(&mut conn).await.unwrap().unwrap();
            assert_eq!((f.fin, f.opcode, f.payload.len()), (true, OP_BINARY, len));
            assert_eq!(f.payload, payload);
            assert!(read_frame(&mut conn).await.unwrap().is_none());
        }
    }
}
