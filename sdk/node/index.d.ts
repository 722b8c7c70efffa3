// Types for @drover/sdk (index.js).

import type { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Server } from 'node:net';

/** A duration: a number of seconds, or a string like "500ms", "10s", "2m", "1h". */
export type Duration = number | string;

/** A member as drover's admin API describes it. */
export interface Member {
  id: string;
  /** The address as registered (may be a name). */
  address: string;
  /** The socket address drover resolved it to. */
  addr: string;
  /** "admin" for members that joined through the API or this SDK. */
  source: string;
  state: 'active' | 'draining' | 'removed';
  weight: number;
  ttl_secs: number | null;
  ttl_left_secs: number | null;
  meta: Record<string, string>;
  in_flight: number;
  [field: string]: unknown;
}

export interface Logger {
  warn(message: string): void;
  error(message: string): void;
}

export interface RegisterOptions {
  /** The server to register; registration starts once it listens. */
  server: Server;
  /** drover's admin API: "http://127.0.0.1:9900" or "127.0.0.1:9900". Default: env DROVER_ADMIN. */
  drover?: string;
  /** The balancer to join. Default: env DROVER_BALANCER. */
  balancer?: string;
  /** Member id (letters, digits, . _ - :). Default: `${hostname}-${pid}-${port}`. */
  id?: string;
  /**
   * How long drover keeps the member without a heartbeat (1s..24h). Default "10s";
   * null or 0: no TTL (the member stays until drained; heartbeats still carry the load).
   */
  ttl?: Duration | null;
  /** Time between heartbeats. Default: ttl / 3 (5 s without a TTL). */
  heartbeat?: Duration;
  /** Relative weight, 1..1000 (drover's default: 1). */
  weight?: number;
  /** Free-form labels. */
  meta?: Record<string, string>;
  /** Bearer token of the admin API. Default: env DROVER_ADMIN_TOKEN. */
  token?: string;
  /**
   * What drover connects to: "host:port", or a host to pair with the server's port.
   * Default: the server's address, 127.0.0.1 when it listens on 0.0.0.0 or ::.
   */
  address?: string;
  /** The utilisation (0..1) a heartbeat reports. Default: event-loop utilisation since the last one. */
  load?: () => number | undefined;
  /** Timeout of each admin API request. Default "5s". */
  timeout?: Duration;
  /**
   * Handle SIGTERM and SIGINT: drain, close the server, exit (0 once requests in flight
   * have finished, 1 after `drainTimeout`). Default true; false leaves signals to the app.
   */
  signals?: boolean;
  /** How long a signal's shutdown waits for requests in flight. Default "30s". */
  drainTimeout?: Duration;
  /** Where 'warning'/'error' go when nothing listens for them. Default console; false: nowhere. */
  logger?: Logger | false;
}

export interface RegisteredInfo {
  /** False when drover already had the member (it was updated). */
  created: boolean;
}

/** The handle `register()` returns. It never throws into the app: failures are events. */
export declare class Registration extends EventEmitter {
  readonly server: Server;
  /** True under `drover run` (DROVER_WORKER_ID set): nothing is registered. */
  readonly supervised: boolean;
  readonly balancer: string | undefined;
  /** The member id; null until the server listens (when it is derived from the port). */
  readonly id: string | null;
  /** The "host:port" registered; null until the server listens. */
  readonly address: string | null;
  /** drover's latest answer about this member. */
  readonly member: Member | null;
  /** Whether drover knows the member as of the latest answer. */
  readonly registered: boolean;
  /** The member at the first registration; null if closed first, or under `drover run`. */
  readonly ready: Promise<Member | null>;

  /**
   * Stops heartbeats and drains the member: drover sends it no new requests and lets
   * those in flight finish. Resolves with drover's answer (state "draining" or
   * "removed"), or null when there was nothing to drain or drover was out of reach.
   * The server keeps running. Idempotent; also called when the server closes.
   */
  close(): Promise<Member | null>;

  on(event: 'registered', listener: (member: Member, info: RegisteredInfo) => void): this;
  on(event: 'heartbeat', listener: (member: Member) => void): this;
  on(event: 'deregistered', listener: (member: Member | null) => void): this;
  /** Transient: drover out of reach, a 404 heartbeat (registering again), a drain by someone else. Retried. */
  on(event: 'warning', listener: (error: Error & { status?: number }) => void): this;
  /** drover refused (4xx: bad token, invalid option, address taken). Retried with back-off too. */
  on(event: 'error', listener: (error: Error & { status?: number }) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
  once(event: 'registered', listener: (member: Member, info: RegisteredInfo) => void): this;
  once(event: 'heartbeat', listener: (member: Member) => void): this;
  once(event: 'deregistered', listener: (member: Member | null) => void): this;
  once(event: 'warning' | 'error', listener: (error: Error & { status?: number }) => void): this;
  once(event: string | symbol, listener: (...args: any[]) => void): this;
}

/**
 * Registers `server` with a balancer of a running drover once it listens, and keeps it
 * registered (heartbeats with its event-loop load; registering again after a 404).
 * Under `drover run` it registers nothing. Throws only for options that cannot work.
 */
export declare function register(options: RegisterOptions): Registration;

export type RequestHandler = (req: IncomingMessage, res: ServerResponse) => void;
export type Middleware = (req: IncomingMessage, res: ServerResponse, next?: (err?: unknown) => void) => void;

/**
 * Adds `endpoint-load-metrics: TEXT named_metrics.elu=X` (event-loop utilisation over
 * the last ~100 ms, 3 decimals) to every response. drover balances by it and strips it.
 *   app.use(loadReporter())                    Express/Connect middleware
 *   http.createServer(loadReporter(handler))   a wrapped request handler
 */
export declare function loadReporter(): Middleware;
export declare function loadReporter(handler: RequestHandler): RequestHandler;

/** The header value for a utilisation: "TEXT named_metrics.elu=0.420". */
export declare function loadMetrics(utilisation: number): string;

/** This process's event-loop utilisation over a recent window (0..1), as loadReporter() sends it. */
export declare function eventLoopUtilization(): number;

/** Whether this process is a `drover run` worker (DROVER_WORKER_ID set). */
export declare function supervisedByDrover(env?: NodeJS.ProcessEnv): boolean;

/** "endpoint-load-metrics". */
export declare const LOAD_HEADER: string;
