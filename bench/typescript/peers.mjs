// Issue 31 §5: the workload of `cairn-bench peers` (a workflow of 10 no-op durable steps)
// written in TypeScript, on Cairn (`cairn serve` + a worker of the SDK) and on Restate
// (restate-server + a service of its TypeScript SDK), side by side in one run: "single" is
// one instance at a time, created and answered when complete (p50 of --runs); "200@50" is
// 200 instances in a closed loop with 50 in flight; "1000@200" likewise. One HTTP request
// per instance that answers when it has finished, on keep-alive connections opened before
// the clock starts. Rounds alternate the systems; the table shows medians, and the CPU
// each process used during the 1000@200 runs (what bounds the figure).
//
//   node peers.mjs [--cairn ../../target/release/cairn] [--runs 100] [--rounds 3] [--only cairn|restate]
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : fallback;
};
const cairnBin = arg("cairn", new URL("../../target/release/cairn", import.meta.url).pathname);
const runs = Number(arg("runs", "100"));
const rounds = Number(arg("rounds", "3"));
const only = arg("only", "");
const here = new URL(".", import.meta.url).pathname;
const children = [];
process.on("exit", () => children.forEach((c) => c.kill("SIGKILL")));

async function freePort() {
  const server = createServer();
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address();
  await new Promise((r) => server.close(r));
  return port;
}

function start(command, args, options = {}) {
  const child = spawn(command, args, { stdio: ["ignore", "pipe", "pipe"], ...options });
  children.push(child);
  let err = "";
  // Read what it writes, or a chatty server blocks on a full pipe.
  child.stderr.on("data", (d) => (err = (err + d).slice(-4000)));
  child.stdout.on("data", () => {});
  child.on("exit", (code) => {
    if (code !== null && code !== 0 && !child.stopping) console.error(`${command} exited ${code}: ${err}`);
  });
  return child;
}

const ready = (child) =>
  new Promise((resolve, reject) => {
    child.stdout.on("data", (d) => d.toString().includes("ready") && resolve());
    child.on("exit", () => reject(new Error("exited before it was ready")));
  });

async function until(url, init) {
  for (let i = 0; i < 600; i++) {
    try {
      const r = await fetch(url, init);
      if (r.ok) return r;
    } catch {}
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${url} never answered`);
}

/** CPU seconds (user + system) a process and its descendants (a launcher's server) have used so far. */
function cpu(pid) {
  let fields;
  try {
    fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
  } catch {
    return 0;
  }
  let total = (Number(fields[11]) + Number(fields[12])) / 100;
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    const children = readFileSync(`/proc/${pid}/task/${task}/children`, "utf8").trim();
    for (const child of children ? children.split(" ") : []) total += cpu(Number(child));
  }
  return total;
}

async function cairn() {
  const dir = mkdtempSync(join(tmpdir(), "cairn-bench-ts-"));
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const server = start(cairnBin, ["serve", "--db", join(dir, "cairn.db"), "--addr", `127.0.0.1:${port}`, "--no-schedules"], {
    env: { ...process.env, RUST_LOG: "warn" },
  });
  await until(`${url}/healthz`);
  const worker = start(process.execPath, [join(here, "cairn-worker.mjs"), url]);
  await ready(worker);
  return {
    name: "Cairn + TS SDK (worker)",
    pids: { server: server.pid, worker: worker.pid },
    async one() {
      const r = await fetch(`${url}/api/workflows/ten/instances?wait=60s`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: "{}",
      });
      const body = await r.json();
      if (body.status !== "complete") throw new Error(`cairn: ${JSON.stringify(body)}`);
    },
    stop() {
      for (const c of [worker, server]) (c.stopping = true), c.kill("SIGTERM");
      setTimeout(() => rmSync(dir, { recursive: true, force: true }), 2000).unref();
    },
  };
}

async function restate() {
  const dir = mkdtempSync(join(tmpdir(), "restate-bench-"));
  const [ingress, admin, node, service] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const server = start(join(here, "node_modules/.bin/restate-server"), ["--no-logo"], {
    env: {
      ...process.env,
      RESTATE_BASE_DIR: dir,
      RESTATE_INGRESS__BIND_ADDRESS: `127.0.0.1:${ingress}`,
      RESTATE_ADMIN__BIND_ADDRESS: `127.0.0.1:${admin}`,
      RESTATE_BIND_ADDRESS: `127.0.0.1:${node}`,
      RUST_LOG: "warn",
    },
  });
  await until(`http://127.0.0.1:${admin}/health`);
  const endpoint = start(process.execPath, [join(here, "restate-service.mjs"), String(service)]);
  await ready(endpoint);
  await until(`http://127.0.0.1:${admin}/deployments`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ uri: `http://127.0.0.1:${service}`, force: true }),
  });
  await until(`http://127.0.0.1:${ingress}/restate/health`);
  return {
    name: "Restate + TS SDK",
    pids: { server: server.pid, worker: endpoint.pid },
    async one() {
      const r = await fetch(`http://127.0.0.1:${ingress}/Bench/run`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: "{}",
      });
      const body = await r.json();
      if (body !== "done") throw new Error(`restate: ${JSON.stringify(body)}`);
    },
    stop() {
      for (const c of [endpoint, server]) (c.stopping = true), c.kill("SIGTERM");
      setTimeout(() => rmSync(dir, { recursive: true, force: true }), 2000).unref();
    },
  };
}

async function single(system) {
  for (let i = 0; i < 10; i++) await system.one();
  const times = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await system.one();
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)];
}

async function closedLoop(system, total, inFlight) {
  // Open the connections first, as a client's pool would.
  await Promise.all(Array.from({ length: inFlight }, () => system.one()));
  const before = Object.fromEntries(Object.entries(system.pids).map(([k, pid]) => [k, cpu(pid)]));
  let left = total;
  const t = performance.now();
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (left > 0) {
        left -= 1;
        await system.one();
      }
    }),
  );
  const seconds = (performance.now() - t) / 1000;
  const used = Object.fromEntries(Object.entries(system.pids).map(([k, pid]) => [k, (cpu(pid) - before[k]) / seconds]));
  return { rate: total / seconds, used };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const makers = [cairn, restate].filter((m) => only === "" || m.name === only);
const results = new Map();
for (let round = 1; round <= rounds; round++) {
  for (const make of makers) {
    const system = await make();
    const r = results.get(system.name) ?? { single: [], small: [], large: [], cpu: [] };
    r.single.push(await single(system));
    r.small.push((await closedLoop(system, 200, 50)).rate);
    const large = await closedLoop(system, 1000, 200);
    r.large.push(large.rate);
    r.cpu.push(large.used);
    results.set(system.name, r);
    console.error(`round ${round} ${system.name}: single ${r.single.at(-1).toFixed(2)} ms, 200@50 ${r.small.at(-1).toFixed(0)}/s, 1000@200 ${r.large.at(-1).toFixed(0)}/s, cpu ${JSON.stringify(large.used, (k, v) => (typeof v === "number" ? Number(v.toFixed(2)) : v))}`);
    system.stop();
    await new Promise((r) => setTimeout(r, 1000));
  }
}
console.log(`\n${runs} single runs, ${rounds} rounds alternated, medians; CPU: cores used during 1000@200 (server / SDK process)\n`);
console.log("| system | single p50 | 200@50 | 1000@200 | CPU server / SDK |");
console.log("|---|---:|---:|---:|---:|");
for (const [name, r] of results) {
  const c = r.cpu[Math.floor(r.cpu.length / 2)];
  console.log(`| ${name} | ${median(r.single).toFixed(2)} ms | ${median(r.small).toFixed(0)} inst/s | ${median(r.large).toFixed(0)} inst/s | ${c.server.toFixed(2)} / ${c.worker.toFixed(2)} |`);
}
const [a, b] = [...results.values()];
if (a && b) {
  console.log(`\nCairn / Restate: single ${(median(a.single) / median(b.single)).toFixed(2)}×, 200@50 ${(median(a.small) / median(b.small)).toFixed(2)}×, 1000@200 ${(median(a.large) / median(b.large)).toFixed(2)}×`);
}
process.exit(0);
