//! The balancer and endpoint metric families, from snapshots. Labels come only from
//! configuration and membership (balancer names, endpoint addresses), never from a
//! request's path or a client's address, so the number of series stays bounded.

use crate::exposition::Exposition;
use crate::histogram::HistogramSnapshot;
use crate::snapshot::{BalancerSnapshot, EndpointSnapshot};
use crate::stats::{
    BackendTlsFailure, Cause, Ejection, ProxyRefusal, SniUnrouted, TlsFailure, CLASSES,
};

/// The causes that are an endpoint's failures (the rest are drover's or the queue's).
const ENDPOINT_FAILURES: [Cause; 7] = [
    Cause::ConnectFailed,
    Cause::BackendClosed,
    Cause::BackendCrashed,
    Cause::BadResponse,
    Cause::BackendTimeout,
    Cause::BackendHung,
    Cause::BackendTls,
];

/// Writes every balancer's and endpoint's families.
pub fn balancers(e: &mut Exposition, balancers: &[BalancerSnapshot]) {
    balancer_families(e, balancers);
    endpoint_families(e, balancers);
}

fn balancer_families(e: &mut Exposition, bs: &[BalancerSnapshot]) {
    e.counter(
        "drover_requests",
        "Requests the balancer answered (by a backend or itself).",
    );
    for b in bs {
        e.sample_u64(&[("balancer", &b.name)], b.counts.requests);
    }
    e.counter(
        "drover_responses",
        "Responses sent to clients, by status class.",
    );
    for b in bs {
        for (class, &n) in CLASSES.iter().zip(&b.counts.responses) {
            e.sample_u64(&[("balancer", &b.name), ("code", class)], n);
        }
    }
    e.counter(
        "drover_errors",
        "Requests drover answered itself with an error, by the drover-error cause.",
    );
    for b in bs {
        for (cause, &n) in Cause::ALL.iter().zip(&b.counts.errors) {
            e.sample_u64(&[("balancer", &b.name), ("cause", cause.as_str())], n);
        }
    }
    e.counter(
        "drover_queue_rejections",
        "Requests refused by the queue: full, or waited the whole queue timeout.",
    );
    for b in bs {
        for (reason, cause) in [("full", Cause::QueueFull), ("timeout", Cause::QueueTimeout)] {
            e.sample_u64(
                &[("balancer", &b.name), ("reason", reason)],
                b.counts.errors[cause as usize],
            );
        }
    }
    e.counter(
        "drover_queue_abandoned",
        "Requests whose client closed its connection while they waited in the queue; never sent to a backend.",
    );
    for b in bs {
        e.sample_u64(&[("balancer", &b.name)], b.counts.queue_abandoned);
    }
    e.counter(
        "drover_retries",
        "Requests sent again to another endpoint, by what went wrong.",
    );
    for b in bs {
        for (cause, &n) in Cause::ALL.iter().zip(&b.counts.retries) {
            if n > 0 {
                e.sample_u64(&[("balancer", &b.name), ("cause", cause.as_str())], n);
            }
        }
    }
    e.counter(
        "drover_handoffs",
        "Client connections handed to a worker that serves them directly (drover run); their requests are not counted by drover.",
    );
    for b in bs {
        e.sample_u64(&[("balancer", &b.name)], b.counts.handoffs);
    }
    e.counter(
        "drover_connections_returned",
        "Client connections a retiring worker (reload, scale-down) gave back between two requests; drover serves them from then on.",
    );
    for b in bs {
        e.sample_u64(&[("balancer", &b.name)], b.counts.returned);
    }
    e.counter(
        "drover_proxy_protocol_refused",
        "Connections closed before any request for their PROXY protocol header: from an untrusted sender, or a trusted one without a valid header.",
    );
    for b in bs {
        for (why, &n) in ProxyRefusal::ALL.iter().zip(&b.counts.proxy_refused) {
            if n > 0 {
                e.sample_u64(&[("balancer", &b.name), ("reason", why.as_str())], n);
            }
        }
    }
    tls_families(e, bs);
    http2_families(e, bs);
    e.counter(
        "drover_access_log_dropped",
        "Access log lines dropped because the log's buffer was full (its writer fell behind); requests never wait for the log.",
    );
    for b in bs {
        e.sample_u64(&[("balancer", &b.name)], b.counts.access_log_dropped);
    }
    e.counter(
        "drover_tcp_connections",
        "TCP mode: client connections relayed to an endpoint.",
    );
    for b in bs {
        e.sample_u64(&[("balancer", &b.name)], b.counts.tcp_connections);
    }
    e.counter(
        "drover_tcp_received_bytes",
        "TCP mode: bytes relayed from clients to endpoints.",
    );
    for b in bs {
        e.sample_u64(&[("balancer", &b.name)], b.counts.tcp_bytes_in);
    }
    e.counter(
        "drover_tcp_sent_bytes",
        "TCP mode: bytes relayed from endpoints to clients.",
    );
    for b in bs {
        e.sample_u64(&[("balancer", &b.name)], b.counts.tcp_bytes_out);
    }
    e.counter(
        "drover_tcp_unserved",
        "TCP mode: client connections closed before an endpoint took them, by cause (no-healthy-endpoint, workers-not-starting, queue-full, queue-timeout, connect-failed, local-resources).",
    );
    for b in bs {
        for (cause, &n) in Cause::ALL.iter().zip(&b.counts.tcp_unserved) {
            if n > 0 {
                e.sample_u64(&[("balancer", &b.name), ("cause", cause.as_str())], n);
            }
        }
    }
    e.counter(
        "drover_tcp_sni_unrouted",
        "TCP mode with SNI routes: client connections closed before any balancer took them, by reason (no-route, not-tls, bad-hello, too-large, timeout, closed).",
    );
    for b in bs {
        for (why, &n) in SniUnrouted::ALL.iter().zip(&b.counts.sni_unrouted) {
            if n > 0 {
                e.sample_u64(&[("balancer", &b.name), ("reason", why.as_str())], n);
            }
        }
    }
    e.histogram(
        "drover_request_duration_seconds",
        "From a request's head to the end of its response (to the 101 of an upgrade).",
    );
    for b in bs {
        e.histogram_sample(&[("balancer", &b.name)], &b.counts.request_duration);
    }
    e.histogram(
        "drover_queue_wait_seconds",
        "From a request's head until it was bound to an endpoint.",
    );
    for b in bs {
        e.histogram_sample(&[("balancer", &b.name)], &b.counts.queue_wait);
    }
    e.gauge(
        "drover_queue_depth",
        "Requests waiting in drover's queue for an endpoint with room.",
        None,
    );
    for b in bs {
        e.sample_u64(&[("balancer", &b.name)], b.queue_depth);
    }
    e.gauge(
        "drover_client_connections",
        "Open client connections.",
        None,
    );
    for b in bs {
        e.sample_u64(&[("balancer", &b.name)], b.connections);
    }
}

/// The HTTP/2 families, with samples for the balancers that have served HTTP/2.
fn http2_families(e: &mut Exposition, bs: &[BalancerSnapshot]) {
    let h2 = |b: &&BalancerSnapshot| b.counts.http2_connections > 0;
    e.counter(
        "drover_http2_connections",
        "Client connections that spoke HTTP/2 (ALPN h2, or h2c with prior knowledge).",
    );
    for b in bs.iter().filter(h2) {
        e.sample_u64(&[("balancer", &b.name)], b.counts.http2_connections);
    }
    e.counter(
        "drover_http2_streams",
        "Requests that came as HTTP/2 streams; drover_requests less these came over HTTP/1.x.",
    );
    for b in bs.iter().filter(h2) {
        e.sample_u64(&[("balancer", &b.name)], b.counts.http2_streams);
    }
    let to_backends = |b: &&BalancerSnapshot| b.counts.backend_http2_connections > 0;
    e.counter(
        "drover_backend_http2_connections",
        "HTTP/2 connections opened to backends (backend_protocol h2c or h2): one per backend and serving thread, more when one ended.",
    );
    for b in bs.iter().filter(to_backends) {
        e.sample_u64(&[("balancer", &b.name)], b.counts.backend_http2_connections);
    }
}

/// The TLS families, with samples for the balancers that serve TLS (or have).
fn tls_families(e: &mut Exposition, bs: &[BalancerSnapshot]) {
    let tls = |b: &&BalancerSnapshot| {
        !b.counts.tls_certificates.is_empty()
            || b.counts.tls_handshakes > 0
            || b.counts.tls_failures.iter().any(|&n| n > 0)
    };
    e.counter(
        "drover_tls_handshakes",
        "TLS handshakes completed on the balancer's listener.",
    );
    for b in bs.iter().filter(tls) {
        e.sample_u64(&[("balancer", &b.name)], b.counts.tls_handshakes);
    }
    e.counter(
        "drover_tls_handshake_failures",
        "TLS handshakes that failed, by reason: timeout, not-tls (plain HTTP to the TLS port), client-alert (the client refused), closed (mid-handshake), protocol, client-cert (no client certificate, or one client_ca did not sign).",
    );
    for b in bs.iter().filter(tls) {
        for (why, &n) in TlsFailure::ALL.iter().zip(&b.counts.tls_failures) {
            e.sample_u64(&[("balancer", &b.name), ("reason", why.as_str())], n);
        }
    }
    e.counter(
        "drover_backend_tls_failures",
        "TLS handshakes with backends (backend_tls) that failed, by reason: unknown-issuer, expired, wrong-name, bad-certificate, client-cert-required, client-cert-refused, not-tls, closed, timeout, protocol, no-alpn.",
    );
    for b in bs {
        for (why, &n) in BackendTlsFailure::ALL
            .iter()
            .zip(&b.counts.backend_tls_failures)
        {
            if n > 0 {
                e.sample_u64(&[("balancer", &b.name), ("reason", why.as_str())], n);
            }
        }
    }
    e.gauge(
        "drover_tls_certificate_expiry_seconds",
        "When each certificate the balancer serves expires (its notAfter), in seconds since the Unix epoch; cert is its file.",
        Some("seconds"),
    );
    for b in bs {
        for c in &b.counts.tls_certificates {
            e.sample(
                &[("balancer", &b.name), ("cert", &c.cert)],
                c.not_after as f64,
            );
        }
    }
}

/// Writes one endpoint's samples, given its `balancer` and `endpoint` labels.
type EndpointWriter<'a> = &'a dyn Fn(&mut Exposition, [(&str, &str); 2], &EndpointSnapshot);

/// An endpoint histogram family: name, help, and which histogram.
struct HistogramFamily {
    name: &'static str,
    help: &'static str,
    of: fn(&EndpointSnapshot) -> &HistogramSnapshot,
}

/// An endpoint gauge family: name, help, unit, and its value.
struct GaugeFamily {
    name: &'static str,
    help: &'static str,
    unit: Option<&'static str>,
    of: fn(&EndpointSnapshot) -> f64,
}

const ENDPOINT_HISTOGRAMS: [HistogramFamily; 4] = [
    HistogramFamily {
        name: "drover_endpoint_request_duration_seconds",
        help: "From binding a request to the endpoint to the end of its response.",
        of: |ep| &ep.counts.request_duration,
    },
    HistogramFamily {
        name: "drover_endpoint_response_head_seconds",
        help: "From binding a request to the endpoint to its response head (the connect included, when a new connection was needed).",
        of: |ep| &ep.counts.response_head,
    },
    HistogramFamily {
        name: "drover_endpoint_connect_seconds",
        help: "New connections to the endpoint, until established.",
        of: |ep| &ep.counts.connect,
    },
    HistogramFamily {
        name: "drover_endpoint_queue_wait_seconds",
        help: "How long the requests bound to the endpoint waited in drover's queue first.",
        of: |ep| &ep.counts.queue_wait,
    },
];

const ENDPOINT_GAUGES: [GaugeFamily; 9] = [
    GaugeFamily {
        name: "drover_endpoint_in_flight",
        help: "Requests the endpoint holds now (a streaming body or tunnel included).",
        unit: None,
        of: |ep| ep.in_flight as f64,
    },
    GaugeFamily {
        name: "drover_endpoint_concurrency_limit",
        help: "The endpoint's concurrency cap in force (learned or configured); 0 = none.",
        unit: None,
        of: |ep| ep.limit as f64,
    },
    GaugeFamily {
        name: "drover_endpoint_waiting",
        help: "Requests awaiting their answer that later ones overtook: they wait (a long-poll, a query), and a learned limit does not count them.",
        unit: None,
        of: |ep| ep.waiting as f64,
    },
    GaugeFamily {
        name: "drover_endpoint_latency_estimate_seconds",
        help: "The balancer's latency estimate for the endpoint (peak EWMA).",
        unit: Some("seconds"),
        of: |ep| ep.latency_estimate_seconds,
    },
    GaugeFamily {
        name: "drover_endpoint_reported_load",
        help: "Utilisation the endpoint reported or was measured at; 1 = saturated.",
        unit: None,
        of: |ep| ep.reported_load,
    },
    GaugeFamily {
        name: "drover_endpoint_weight",
        help: "The endpoint's weight.",
        unit: None,
        of: |ep| ep.weight as f64,
    },
    GaugeFamily {
        name: "drover_endpoint_up",
        help: "1 when active health checks pass (or none run).",
        unit: None,
        of: |ep| f64::from(u8::from(ep.healthy)),
    },
    GaugeFamily {
        name: "drover_endpoint_available",
        help: "1 when the balancer may pick the endpoint: healthy and not ejected.",
        unit: None,
        of: |ep| f64::from(u8::from(ep.available)),
    },
    GaugeFamily {
        name: "drover_endpoint_sessions",
        help: "socket.io sessions the balancer keeps on the endpoint: pinned by their handshake, each request of one goes there.",
        unit: None,
        of: |ep| ep.sessions as f64,
    },
];

fn endpoint_families(e: &mut Exposition, bs: &[BalancerSnapshot]) {
    let each = |e: &mut Exposition, f: EndpointWriter<'_>| {
        for b in bs {
            for ep in &b.endpoints {
                f(e, [("balancer", &b.name), ("endpoint", &ep.address)], ep);
            }
        }
    };
    e.counter(
        "drover_endpoint_responses",
        "Response heads from the endpoint, by status class.",
    );
    each(e, &|e, [b, ep_label], ep| {
        for (class, &n) in CLASSES.iter().zip(&ep.counts.responses) {
            e.sample_u64(&[b, ep_label, ("code", class)], n);
        }
    });
    e.counter(
        "drover_endpoint_failures",
        "Requests to the endpoint that failed before a usable response head, by cause.",
    );
    each(e, &|e, [b, ep_label], ep| {
        for cause in ENDPOINT_FAILURES {
            let n = ep.counts.failures[cause as usize];
            if n > 0 {
                e.sample_u64(&[b, ep_label, ("cause", cause.as_str())], n);
            }
        }
    });
    e.counter(
        "drover_endpoint_ejections",
        "Times the endpoint was taken out of rotation by passive health, by reason.",
    );
    each(e, &|e, [b, ep_label], ep| {
        for (why, &n) in Ejection::ALL.iter().zip(&ep.counts.ejections) {
            if n > 0 {
                e.sample_u64(&[b, ep_label, ("reason", why.as_str())], n);
            }
        }
    });
    e.counter(
        "drover_endpoint_health_checks",
        "Active health checks of the endpoint, by result.",
    );
    each(e, &|e, [b, ep_label], ep| {
        let c = &ep.counts;
        if c.checks_passed + c.checks_failed > 0 {
            e.sample_u64(&[b, ep_label, ("result", "pass")], c.checks_passed);
            e.sample_u64(&[b, ep_label, ("result", "fail")], c.checks_failed);
        }
    });
    for family in &ENDPOINT_HISTOGRAMS {
        e.histogram(family.name, family.help);
        each(e, &|e, labels, ep| {
            e.histogram_sample(&labels, (family.of)(ep))
        });
    }
    for family in &ENDPOINT_GAUGES {
        e.gauge(family.name, family.help, family.unit);
        each(e, &|e, labels, ep| e.sample(&labels, (family.of)(ep)));
    }
}
