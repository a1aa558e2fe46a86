// One WebSocket to the engine's /api/workers: JSON text frames in and out, pings to find
// a dead peer, and one `closed` report however it ends. It knows nothing of the protocol's
// messages; the worker (worker.ts) reconnects by making a new Connection.

import WebSocket from "ws";
import { MAX_FRAME_BYTES } from "./protocol.js";

export interface ConnectionEvents {
  open(): void;
  /** A frame's JSON, or the reason it was unreadable. */
  message(value: unknown): void;
  malformed(reason: string): void;
  /** Once, however the connection ended. `fatal` when trying again cannot help (401, 403). */
  closed(reason: string, fatal: boolean): void;
}

export interface ConnectionOptions {
  url: string;
  token: string | undefined;
  /** How often to ping the engine; a connection silent for two intervals is dropped. 0: never. */
  heartbeatMs: number;
}

/** The worker protocol's endpoint for a server URL: ws:// from http://, wss:// from https://. */
export function workersUrl(server: string): string {
  const url = new URL(server);
  if (url.protocol === "http:") url.protocol = "ws:";
  else if (url.protocol === "https:") url.protocol = "wss:";
  else if (url.protocol !== "ws:" && url.protocol !== "wss:") {
    throw new TypeError(`the server URL must be http(s):// or ws(s)://, not ${server}`);
  }
  url.pathname = `${url.pathname.replace(/\/+$/, "")}/api/workers`;
  return url.toString();
}

export class Connection {
  readonly #socket: WebSocket;
  readonly #events: ConnectionEvents;
  #heartbeat: NodeJS.Timeout | undefined;
  /** Pings sent since the engine last sent anything. */
  #unanswered = 0;
  #reason = "closed";
  #fatal = false;
  #ended = false;

  constructor(options: ConnectionOptions, events: ConnectionEvents) {
    this.#events = events;
    const headers: Record<string, string> = {};
    if (options.token) headers.Authorization = `Bearer ${options.token}`;
    this.#socket = new WebSocket(options.url, {
      headers,
      maxPayload: MAX_FRAME_BYTES,
      // The engine does not compress, and frames are small.
      perMessageDeflate: false,
      handshakeTimeout: 10_000,
    });
    const socket = this.#socket;
    socket.on("open", () => {
      if (options.heartbeatMs > 0) {
        this.#heartbeat = setInterval(() => this.#beat(), options.heartbeatMs);
        this.#heartbeat.unref();
      }
      events.open();
    });
    socket.on("message", (data, isBinary) => {
      this.#unanswered = 0;
      if (isBinary) {
        events.malformed("a binary frame (the protocol sends JSON text)");
        return;
      }
      let value: unknown;
      try {
        value = JSON.parse(data.toString());
      } catch {
        events.malformed("a frame that is not JSON");
        return;
      }
      events.message(value);
    });
    // `ws` answers the engine's pings by itself; these are the answers to ours.
    socket.on("pong", () => {
      this.#unanswered = 0;
    });
    socket.on("unexpected-response", (_request, response) => {
      const status = response.statusCode ?? 0;
      this.#reason = `the server answered the upgrade with HTTP ${status}`;
      this.#fatal = status === 401 || status === 403;
      if (status === 401) this.#reason += " (the token is missing or wrong)";
      response.resume();
      socket.terminate();
    });
    socket.on("error", (error) => {
      if (this.#reason === "closed") this.#reason = error.message;
    });
    socket.on("close", (code, reason) => {
      if (this.#reason === "closed") {
        this.#reason = `closed by the server (${code}${reason.length > 0 ? ` ${reason.toString()}` : ""})`;
      }
      this.#end();
    });
  }

  /** Sends one frame; false if the socket is not open (the frame is dropped). */
  send(text: string): boolean {
    if (this.#socket.readyState !== WebSocket.OPEN) return false;
    this.#socket.send(text);
    return true;
  }

  /** Closes with a normal close frame; `closed` follows. */
  close(reason: string): void {
    this.#reason = reason;
    if (this.#socket.readyState === WebSocket.CONNECTING) this.#socket.terminate();
    else this.#socket.close(1000);
    // A peer that never answers the close frame must not hold the worker open.
    setTimeout(() => this.#socket.terminate(), 2_000).unref();
  }

  #beat(): void {
    // Two intervals, not one: after user code has blocked the event loop, this timer can
    // run before the pong that already arrived is read.
    if (this.#unanswered >= 2) {
      this.#reason = "the server stopped answering pings";
      this.#socket.terminate();
      return;
    }
    this.#unanswered += 1;
    this.#socket.ping();
  }

  #end(): void {
    if (this.#ended) return;
    this.#ended = true;
    clearInterval(this.#heartbeat);
    this.#events.closed(this.#reason, this.#fatal);
  }
}
