// Crashes against a real `cairn serve` (CAIRN_BIN): SIGKILL of the worker process, then of
// the server, at seeded moments while 50 instances run; then two workers sharing the load
// and one of them killed. The workflow (fixtures/crash-worker.ts) writes every step body's
// start and end to a ledger outside the engine, and the tests compare that ledger with what
// the engine recorded: every instance ends with its fault-free output, no attempt ran twice,
// no body ran after its step's success was committed, and interrupted attempts are recorded.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, afterEach, before, describe, it } from "node:test";
import { workflowBinding } from "@cairn-engine/workflows";
import {
  type Details,
  type LedgerLine,
  Random,
  Server,
  WorkerProcess,
  fixture,
  pause,
  readLedger,
  skipWithoutBin,
  token,
  until,
} from "./real-engine.js";

const INSTANCES = 50;
const KILLS = 10;

/** What `crashy` returns for `n` when nothing goes wrong. */
function faultFree(n: number) {
  const a = n * 2;
  const b = a + 1;
  const c = a + 2;
  return { n, a, b, c, d: b * c };
}

const ids = (prefix: string, count: number) => Array.from({ length: count }, (_, i) => `${prefix}-${i}`);

async function createAll(server: Server, prefix: string, count: number): Promise<string[]> {
  const binding = workflowBinding<{ n: number }>("crashy", { url: server.url, token });
  const all = ids(prefix, count);
  const created = await binding.createBatch(all.map((id, n) => ({ id, params: { n } })));
  assert.equal(created.length, count);
  return all;
}

/** Waits until every instance has finished; returns their details. */
async function finished(server: Server, all: string[], timeoutMs = 90_000): Promise<Map<string, Details>> {
  await until(
    `all ${all.length} crashy instances to finish`,
    async () => {
      const rows = await server.instances("crashy");
      const open = rows.filter((r) => all.includes(r.id) && !["complete", "errored", "terminated"].includes(r.status));
      return open.length === 0 ? true : undefined;
    },
    timeoutMs,
  ).catch((error: Error) => {
    throw new Error(`${error.message}\nserver log:\n${server.logTail(80)}`);
  });
  const details = new Map<string, Details>();
  for (const id of all) details.set(id, await server.details("crashy", id));
  return details;
}

interface Summary {
  /** Steps whose details show more than one attempt. */
  retried: number;
  /** Attempts the engine recorded that did not succeed (interrupted by a kill). */
  failedAttempts: number;
  /** Bodies that started and never finished (killed mid-body). */
  cutShort: number;
}

/**
 * The ledger against the engine's records: each instance complete with its fault-free
 * output; per (instance, step) no attempt number started twice, every attempt that started
 * is one the engine recorded, nothing started after the attempt that succeeded, and the
 * attempt that succeeded ran to its end.
 */
function checkLedger(all: string[], details: Map<string, Details>, ledger: LedgerLine[]): Summary {
  const summary: Summary = { retried: 0, failedAttempts: 0, cutShort: 0 };
  for (const line of ledger) assert.ok(all.includes(line.instance), `a ledger line of an unknown instance: ${JSON.stringify(line)}`);
  all.forEach((id, n) => {
    const d = details.get(id)!;
    assert.equal(d.status, "complete", `${id}: ${JSON.stringify(d.error)}`);
    assert.deepEqual(d.output, faultFree(n), `${id}'s output`);
    const steps = (d.steps as Details[]).filter((s) => s.type === "step");
    assert.deepEqual(steps.map((s) => s.name).sort(), ["a", "b", "c", "d"], `${id}'s steps`);
    for (const step of steps) {
      const attempts = step.attempts as Details[];
      const recorded = attempts.map((a) => a.attempt as number);
      const succeeded = attempts.filter((a) => a.success === true).map((a) => a.attempt as number);
      assert.equal(succeeded.length, 1, `${id}/${step.name}: one successful attempt in ${JSON.stringify(attempts)}`);
      const won = succeeded[0]!;
      assert.equal(won, Math.max(...recorded), `${id}/${step.name}: the successful attempt is the last one recorded`);
      const mine = ledger.filter((l) => l.instance === id && l.step === step.name);
      const starts = mine.filter((l) => l.phase === "start").map((l) => l.attempt);
      const ends = mine.filter((l) => l.phase === "end").map((l) => l.attempt);
      const context = `${id}/${step.name}: ledger ${JSON.stringify(mine)}, engine attempts ${JSON.stringify(attempts)}`;
      assert.equal(new Set(starts).size, starts.length, `no attempt ran twice: ${context}`);
      for (const attempt of starts) {
        assert.ok(recorded.includes(attempt), `every body that ran is an attempt the engine recorded: ${context}`);
        assert.ok(attempt <= won, `no body ran after the step's success was committed: ${context}`);
      }
      assert.ok(starts.includes(won) && ends.includes(won), `the successful attempt ran to its end: ${context}`);
      if (attempts.length > 1) summary.retried += 1;
      summary.failedAttempts += attempts.filter((a) => a.success !== true).length;
      summary.cutShort += starts.filter((a) => !ends.includes(a)).length;
    }
  });
  return summary;
}

describe("crashes against cairn serve", { skip: skipWithoutBin("crash.test.ts") }, () => {
  let server: Server;
  /** The workers of the test running now: killed when it ends, whatever its outcome. */
  let workers: WorkerProcess[] = [];
  const spawnWorker = (label: string, ledger: string, concurrency = 4) => {
    const worker = new WorkerProcess(fixture("crash-worker"), label, {
      CAIRN_URL: server.url,
      CAIRN_TOKEN: token,
      LEDGER: ledger,
      CONCURRENCY: String(concurrency),
    });
    workers.push(worker);
    return worker;
  };

  before(async () => {
    server = await Server.start();
  });

  afterEach(async () => {
    for (const worker of workers) await worker.kill();
    workers = [];
  });

  after(async () => {
    await server?.close();
  });

  it(`SIGKILL of the worker process ${KILLS} times while ${INSTANCES} instances run: nothing lost, nothing run twice`, async () => {
    const random = new Random("worker SIGKILL");
    const ledger = join(server.dir, "worker-kills.ledger");
    let worker = spawnWorker("w0", ledger);
    await worker.connected();
    const all = await createAll(server, "wk", INSTANCES);
    const moments: number[] = [];
    for (let kill = 1; kill <= KILLS; kill += 1) {
      const wait = random.between(100, 500);
      moments.push(wait);
      await pause(wait);
      await worker.kill();
      worker = spawnWorker(`w${kill}`, ledger);
      await worker.connected();
    }
    const details = await finished(server, all);
    const summary = checkLedger(all, details, readLedger(ledger));
    process.stderr.write(`worker SIGKILL: kills after ${moments.join(", ")} ms; ${JSON.stringify(summary)}\n`);
    assert.ok(summary.retried > 0 && summary.failedAttempts > 0, `interrupted attempts are recorded: ${JSON.stringify(summary)}`);
    assert.ok(summary.cutShort > 0, `some kill landed mid-body: ${JSON.stringify(summary)}`);
  });

  it(`SIGKILL of the server ${KILLS} times while ${INSTANCES} instances run: the worker reconnects, nothing lost, nothing run twice`, async () => {
    const random = new Random("server SIGKILL");
    const ledger = join(server.dir, "server-kills.ledger");
    const worker = spawnWorker("s", ledger);
    await worker.connected();
    const all = await createAll(server, "sk", INSTANCES);
    const moments: number[] = [];
    for (let kill = 1; kill <= KILLS; kill += 1) {
      const wait = random.between(100, 500);
      moments.push(wait);
      await pause(wait);
      const sessions = worker.sessions;
      await server.kill();
      await server.restart();
      // The worker finds the new server by itself (its back-off starts at 100 ms).
      await worker.connected(sessions + 1);
    }
    const details = await finished(server, all);
    const summary = checkLedger(all, details, readLedger(ledger));
    process.stderr.write(`server SIGKILL: kills after ${moments.join(", ")} ms; ${JSON.stringify(summary)}\n`);
    assert.ok(summary.retried > 0 && summary.failedAttempts > 0, `interrupted attempts are recorded: ${JSON.stringify(summary)}`);
  });

  it("two workers share the load; one is killed mid-body and the other finishes everything", async () => {
    const ledger = join(server.dir, "two-workers.ledger");
    const a = spawnWorker("A", ledger, 3);
    const b = spawnWorker("B", ledger, 3);
    await Promise.all([a.connected(), b.connected()]);
    await until("both workers to be listed as connected", async () => {
      const names = (await server.connected()).map((w) => w.worker).sort();
      return names.includes("crash-worker-A") && names.includes("crash-worker-B") ? names : undefined;
    });
    const all = await createAll(server, "tw", 40);
    // Both take work; then A dies while one of its bodies runs.
    await until("both workers to run step bodies", () => {
      const lines = readLedger(ledger);
      return lines.some((l) => l.worker === "A") && lines.some((l) => l.worker === "B") ? true : undefined;
    });
    await until("a body of A to be running", () => {
      const lines = readLedger(ledger).filter((l) => l.worker === "A");
      const key = (l: LedgerLine) => `${l.instance} ${l.step} ${l.attempt}`;
      const ended = new Set(lines.filter((l) => l.phase === "end").map(key));
      return lines.some((l) => l.phase === "start" && !ended.has(key(l))) ? true : undefined;
    });
    await a.kill();
    await until("only B to be connected", async () => {
      const names = (await server.connected()).map((w) => w.worker);
      return names.length === 1 && names[0] === "crash-worker-B" ? true : undefined;
    });
    const details = await finished(server, all);
    const lines = readLedger(ledger);
    const summary = checkLedger(all, details, lines);
    process.stderr.write(`two workers: ${JSON.stringify(summary)}\n`);

    // What A was running when it died ran again on B, as a new attempt, and succeeded there.
    const key = (l: LedgerLine) => `${l.instance} ${l.step} ${l.attempt}`;
    const endedOnA = new Set(lines.filter((l) => l.worker === "A" && l.phase === "end").map(key));
    const cut = lines.filter((l) => l.worker === "A" && l.phase === "start" && !endedOnA.has(key(l)));
    assert.ok(cut.length > 0, "A was killed mid-body");
    for (const line of cut) {
      const step = (details.get(line.instance)!.steps as Details[]).find((s) => s.name === line.step)!;
      const won = (step.attempts as Details[]).find((x) => x.success === true)!.attempt as number;
      assert.ok(won > line.attempt, `${key(line)}: retried as a later attempt (${won})`);
      const winner = lines.find((l) => l.instance === line.instance && l.step === line.step && l.attempt === won && l.phase === "end");
      assert.equal(winner?.worker, "B", `${key(line)} finished on B`);
    }
    const byWorker = (w: string) => new Set(lines.filter((l) => l.worker === w).map((l) => l.instance)).size;
    assert.ok(byWorker("A") > 0 && byWorker("B") > 0, `both ran instances: A ${byWorker("A")}, B ${byWorker("B")}`);
  });
});
