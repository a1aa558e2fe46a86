"""Cloudflare's Python SDK (`pip install cloudflare`) against a running `cairn serve`.

Run by tests/cloudflare.rs with CAIRN_URL (…/client/v4), CAIRN_API (…/api), CAIRN_TOKEN and
CAIRN_ACCOUNT set. Each result is checked through Cairn's own API; any failure raises.
"""

import json
import os
import time
import urllib.error
import urllib.request

import cloudflare
from cloudflare import Cloudflare

URL, API, TOKEN, ACCOUNT = (os.environ[k] for k in ("CAIRN_URL", "CAIRN_API", "CAIRN_TOKEN", "CAIRN_ACCOUNT"))
cf = Cloudflare(api_token=TOKEN, base_url=URL, max_retries=0)
wf = cf.workflows
inst = cf.workflows.instances


def api(path):
    request = urllib.request.Request(API + path, headers={"Authorization": "Bearer " + TOKEN})
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


def raw(method, path, body, content_type="application/json"):
    """A request to Cloudflare's routes without the SDK: the status and the headers."""
    request = urllib.request.Request(
        URL + path, data=body.encode(), method=method,
        headers={"Authorization": "Bearer " + TOKEN, "Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, answer.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def until(workflow, id, status):
    deadline = time.time() + 20
    while True:
        now = api(f"/workflows/{workflow}/instances/{id}")["status"]
        if now == status:
            return
        assert time.time() < deadline, f"{workflow}/{id} never reached {status} (is {now})"
        time.sleep(0.02)


def fails(call, exception, code):
    try:
        call()
    except exception as e:
        assert e.errors and e.errors[0].code == code, (e.errors, code)
        return e
    raise AssertionError(f"expected {exception.__name__} with code {code}")


# Workflows and versions.
names = [w.name for w in wf.list(account_id=ACCOUNT)]
assert names == ["greet", "approval", "nap", "report", "checkout", "order", "relay"], names
assert [w.name for w in wf.list(account_id=ACCOUNT, search="pp")] == ["approval"]
greet = wf.get("greet", account_id=ACCOUNT)
assert greet.name == "greet" and greet.id and greet.created_on, greet
versions = list(wf.versions.list("greet", account_id=ACCOUNT))
assert len(versions) == 1, versions
version = wf.versions.get(versions[0].id, account_id=ACCOUNT, workflow_name="greet")
assert version.id == versions[0].id and version.workflow_id == greet.id

# Create (params as an object, and as JSON text), bulk create.
created = inst.create("greet", account_id=ACCOUNT, instance_id="p1", params={"name": "Py"})
assert created.id == "p1" and created.workflow_id == greet.id and created.version_id == version.id, created
inst.create("greet", account_id=ACCOUNT, instance_id="p2", params=json.dumps({"name": "Text"}))
bulk = list(inst.bulk("greet", account_id=ACCOUNT, body=[{"instance_id": "b1"}, {"instance_id": "b2", "params": "{}"}]))
assert [b.id for b in bulk] == ["b1", "b2"], bulk
# An id that exists is skipped, as on Cloudflare.
assert list(inst.bulk("greet", account_id=ACCOUNT, body=[{"instance_id": "b1"}])) == []
for id in ("p1", "p2", "b1", "b2"):
    until("greet", id, "complete")
assert api("/workflows/greet/instances/p2")["params"] == {"name": "Text"}

# Get: Cloudflare's fields, steps with their attempts.
p1 = inst.get("p1", account_id=ACCOUNT, workflow_name="greet")
assert p1.status == "complete" and p1.success is True, p1
assert p1.version_id == version.id, p1  # versionId on the wire
assert p1.params == {"name": "Py"} and p1.output == "Hello, Py!", p1
assert p1.step_count == 2 and [s.name for s in p1.steps] == ["compose greeting", "deliver greeting"], p1.steps
assert p1.steps[0].type == "step" and p1.steps[0].attempts[0].success is True, p1.steps[0]
assert p1.steps[0].output == "Hello, Py!"
simple = inst.get("p1", account_id=ACCOUNT, workflow_name="greet", simple="true")
assert simple.steps == [] and simple.step_count == 2, simple
desc = inst.get("p1", account_id=ACCOUNT, workflow_name="greet", order="desc")
assert [s.name for s in desc.steps] == ["deliver greeting", "compose greeting"]

# The step route: a step's full output.
out = inst.step("p1", account_id=ACCOUNT, workflow_name="greet", name="compose greeting-1", type="step")
assert out.status == "complete" and out.output == "Hello, Py!", out
first_attempt = inst.step("p1", account_id=ACCOUNT, workflow_name="greet", name="compose greeting", type="step", attempt=1)
assert first_attempt.status == "complete" and first_attempt.output == "Hello, Py!", first_attempt
fails(lambda: inst.step("p1", account_id=ACCOUNT, workflow_name="greet", name="nope", type="step"), cloudflare.NotFoundError, 10410)

# List: a status filter, pages of two (the SDK asks for page 2, 3, … until one is empty),
# and a date range with nothing in it.
listed = [i.id for i in inst.list("greet", account_id=ACCOUNT, status="complete", per_page=2)]
assert sorted(listed) == ["b1", "b2", "p1", "p2"], listed
assert listed == ["b2", "b1", "p2", "p1"], "newest first"
oldest = [i.id for i in inst.list("greet", account_id=ACCOUNT, status="complete", per_page=2, direction="asc")]
assert oldest == ["p1", "p2", "b1", "b2"], oldest
assert [i.id for i in inst.list("greet", account_id=ACCOUNT, status="errored")] == []
assert list(inst.list("greet", account_id=ACCOUNT, date_start="2999-01-01T00:00:00Z")) == []
# A range with both ends on rows: both ends are in it (inclusive), the SDK's +00:00 form too.
rows = inst.list("greet", account_id=ACCOUNT, per_page=4)
assert [r.id for r in rows.result] == ["b2", "b1", "p2", "p1"] and not rows.result_info.cursor, "the last page has no cursor"
newest, oldest = rows.result[0].created_on, rows.result[3].created_on
ranged = [i.id for i in inst.list("greet", account_id=ACCOUNT, date_start=oldest, date_end=newest)]
assert ranged == ["b2", "b1", "p2", "p1"], ranged
assert [i.id for i in inst.list("greet", account_id=ACCOUNT, date_end=oldest)] == [
    r.id for r in rows.result if r.created_on <= oldest
]
first = inst.list("greet", account_id=ACCOUNT, per_page=1)
assert first.result[0].id == "b2" and first.result[0].created_on, first.result
assert first.result_info.cursor, "more instances follow: a cursor"
after = inst.list("greet", account_id=ACCOUNT, per_page=1, cursor=first.result_info.cursor)
assert after.result[0].id == "b1", after.result

# Status changes and events, checked through Cairn's API.
inst.create("approval", account_id=ACCOUNT, instance_id="a1", params={"amount": 7})
until("approval", "a1", "waiting")
paused = inst.status.edit("a1", account_id=ACCOUNT, workflow_name="approval", status="pause")
assert paused.status == "paused" and paused.timestamp, paused
assert api("/workflows/approval/instances/a1")["status"] == "paused"
inst.status.edit("a1", account_id=ACCOUNT, workflow_name="approval", status="resume")
sent = inst.events.create("approved", account_id=ACCOUNT, workflow_name="approval", instance_id="a1", body={"by": "py"})
assert sent.instance_id == "a1" and sent.timestamp, sent
until("approval", "a1", "complete")
assert api("/workflows/approval/instances/a1")["output"]["approval"] == {"by": "py"}
wait = inst.step("a1", account_id=ACCOUNT, workflow_name="approval", name="wait for approval-1", type="waitForEvent")
assert wait.status == "complete" and wait.output["payload"] == {"by": "py"}, wait
# Restart from a step; terminate.
inst.status.edit("a1", account_id=ACCOUNT, workflow_name="approval", status="restart", from_={"name": "wait for approval", "type": "waitForEvent"})
until("approval", "a1", "waiting")
terminated = inst.status.edit("a1", account_id=ACCOUNT, workflow_name="approval", status="terminate")
assert terminated.status == "terminated", terminated
a1 = inst.get("a1", account_id=ACCOUNT, workflow_name="approval")
assert a1.steps[-1].type == "termination", a1.steps

# Errors: Cloudflare's envelope and codes, and no retry of a 409.
fails(lambda: inst.get("nope", account_id=ACCOUNT, workflow_name="greet"), cloudflare.NotFoundError, 10400)
fails(lambda: wf.get("nope", account_id=ACCOUNT), cloudflare.NotFoundError, 10200)
fails(lambda: wf.get("greet", account_id="someone-else"), cloudflare.NotFoundError, 7003)
bad = Cloudflare(api_token="wrong", base_url=URL, max_retries=0)
fails(lambda: bad.workflows.get("greet", account_id=ACCOUNT), cloudflare.AuthenticationError, 9109)
fails(lambda: inst.create("greet", account_id=ACCOUNT, instance_id="p1"), cloudflare.ConflictError, 10405)
# The SDK retries a 409 (POST too) unless told not to.
status, headers = raw("POST", f"/accounts/{ACCOUNT}/workflows/greet/instances", '{"instance_id": "p1"}')
assert status == 409 and headers["x-should-retry"] == "false", (status, dict(headers))
# A body that is not declared JSON (what a web page can send cross-site) is refused.
status, _ = raw("POST", f"/accounts/{ACCOUNT}/workflows/greet/instances", '{"instance_id": "csrf"}', "text/plain")
assert status == 415, status
fails(lambda: inst.get("csrf", account_id=ACCOUNT, workflow_name="greet"), cloudflare.NotFoundError, 10400)
# An array is not a status change.
status, _ = raw("PATCH", f"/accounts/{ACCOUNT}/workflows/greet/instances/p1/status", '["pause", null, null]')
assert status == 400, status
# Bad input in a batch fails it whole: nothing is created.
fails(lambda: list(inst.bulk("greet", account_id=ACCOUNT, body=[{"instance_id": "ok1"}, {"instance_id": "bad id!"}])), cloudflare.BadRequestError, 10002)
fails(lambda: inst.get("ok1", account_id=ACCOUNT, workflow_name="greet"), cloudflare.NotFoundError, 10400)
fails(lambda: inst.create("greet", account_id=ACCOUNT, instance_id="bad id!"), cloudflare.BadRequestError, 10002)

# Deleting a workflow deletes its instances; its code stays registered.
inst.create("nap", account_id=ACCOUNT, instance_id="n1")
assert wf.delete("nap", account_id=ACCOUNT).status == "ok"
deadline = time.time() + 20
while api("/workflows/nap/instances")["instances"]:
    assert time.time() < deadline, "the workflow's instances were not deleted"
    time.sleep(0.02)
assert inst.create("nap", account_id=ACCOUNT, instance_id="n2").id == "n2"
print("the Python SDK passed")
