// Times each hop of one 10-step instance over the raw worker protocol: op → attempt (the
// step's start committed), attemptResult → opResult (its outcome committed).
import { createRequire } from "node:module";
const WebSocket = createRequire(import.meta.resolve("@cairn-engine/workflows"))("ws");
const url = process.argv[2];
const ws = new WebSocket(`${url.replace("http", "ws")}/api/workers`);
await new Promise((r) => ws.once("open", r));
ws.send(JSON.stringify({ type: "hello", protocol: 1, worker: "hops", workflows: [{ name: "hops", version: "1" }], concurrency: 10 }));
const t = { op: [], res: [] };
let sent = 0;
ws.on("message", (data) => {
  const m = JSON.parse(data.toString());
  const now = performance.now();
  if (m.type === "start" || m.type === "opResult") {
    if (m.type === "opResult") t.res.push(now - sent);
    const seq = m.type === "start" ? 0 : m.seq + 1;
    if (seq === 10) {
      ws.send(JSON.stringify({ type: "runResult", run: m.run, ok: "done" }));
      return;
    }
    sent = performance.now();
    ws.send(JSON.stringify({ type: "op", run: m.run, seq, op: "do", name: `s${seq}`, config: null, delayFunction: false }));
    ws.send(JSON.stringify({ type: "idle", run: m.run, ops: seq + 1 }));
  } else if (m.type === "attempt") {
    t.op.push(now - sent);
    sent = performance.now();
    ws.send(JSON.stringify({ type: "attemptResult", run: m.run, task: m.task, ok: 1 }));
  }
});
await new Promise((r) => setTimeout(r, 300));
for (let i = 0; i < 20; i++) {
  const s = performance.now();
  const r = await fetch(`${url}/api/workflows/hops/instances?wait=30s`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  const b = await r.json();
  if (i >= 10) console.log(`total ${(performance.now() - s).toFixed(2)} ms ${b.status}`);
}
const med = (xs) => xs.sort((a, b) => a - b)[xs.length >> 1].toFixed(2);
console.log(`op→attempt p50 ${med(t.op)} ms, attemptResult→opResult p50 ${med(t.res)} ms`);
process.exit(0);
