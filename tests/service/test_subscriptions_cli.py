"""`csnd subscriptions list|reset|delete` against a real `csnd serve`: names listed, reset and deleted.

A named subscription keeps its table filter across reconnects, resets and
restarts of the service; a deleted one leaves Status and /metrics; a name a
consumer holds cannot be reset or deleted; every call needs the token.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from csnd.service.filtering import TableFilter
from tests.service.servekit import CSND, Served, start_serve, subscribe, wait_for

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cluster")
    subprocess.run(
        [*CSND, "generate", "--nodes", "2", "--transactions", "200", "--seed", "5", "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def manage(*args: str, token: str | None = TOKEN, tmp: Path) -> subprocess.CompletedProcess[str]:
    extra: list[str] = []
    if token is not None:
        (tmp / "token").write_text(token + "\n")
        extra = ["--token-file", str(tmp / "token")]
    return subprocess.run(
        [*CSND, "subscriptions", *args, *extra], capture_output=True, text=True, timeout=120, check=False
    )


def listed(served: Served, tmp: Path) -> list[list[str]]:
    got = manage("list", served.address, tmp=tmp)
    assert got.returncode == 0, got.stderr
    return [line.split("\t") for line in got.stdout.splitlines()]


def http(served: Served, path: str) -> str:
    assert served.http is not None
    request = urllib.request.Request(served.http + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        text: str = r.read().decode()
    return text


def consumers(served: Served) -> dict[str, dict[str, Any]]:
    return {c.get("name", ""): c for c in json.loads(http(served, "api/status"))["consumers"]}


def test_list_reset_delete_keep_the_filter_and_leave_status(cluster: Path, tmp_path: Path) -> None:
    expected = (cluster / "expected.jsonl").read_text().splitlines()
    acct = [k.decode() for x in expected if (k := TableFilter(["public.acct"]).keep(x.encode())) is not None]
    csn = [json.loads(x)["csn"] for x in acct]
    log = str(tmp_path / "log")
    (tmp_path / "token").write_text(TOKEN)
    serve_args = ("--token-file", str(tmp_path / "token"))
    served = start_serve([str(cluster / "dn1.pgstream"), str(cluster / "dn2.pgstream")], log, *serve_args)
    try:
        last = json.loads(expected[-1])["csn"]
        wait_for(
            lambda: json.loads(http(served, "api/status"))["changelog"].get("newest_csn") == str(last), "all"
        )
        sub = ("--token-file", str(tmp_path / "token"))
        first = subscribe(served.address, "--name", "billing", "--table", "public.acct", "--limit", "3", *sub)
        assert first.returncode == 0, first.stderr
        assert first.stdout.splitlines() == acct[:3]
        behind = sum(1 for x in expected if json.loads(x)["csn"] > csn[2])
        assert listed(served, tmp_path) == [["billing", str(csn[2]), str(behind), "idle", "public.acct"]]

        # every call needs the token, as Subscribe does
        refused = manage("list", served.address, token=None, tmp=tmp_path)
        assert refused.returncode == 1 and "refused us" in refused.stderr and "token" in refused.stderr

        # back to the first line: the name reads again from there, with its own filter
        reset = manage("reset", served.address, "billing", "--csn", str(csn[0]), tmp=tmp_path)
        assert reset.returncode == 0, reset.stderr
        assert f"reset subscription billing to csn {csn[0]} (it was at csn {csn[2]})" in reset.stderr
        again = subscribe(served.address, "--name", "billing", "--limit", "2", *sub)  # (no --table)
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines() == acct[1:3]
        assert consumers(served)["billing"]["tables"] == ["public.acct"]

        # refused: a csn past the newest, an unknown name
        past = manage("reset", served.address, "billing", "--csn", str(last + 1), tmp=tmp_path)
        assert past.returncode == 1 and f"the newest durable csn is {last}" in past.stderr, past.stderr
        unknown = manage("delete", served.address, "nobody", tmp=tmp_path)
        assert unknown.returncode == 1
        assert "cannot delete subscription 'nobody'" in unknown.stderr
        assert "no subscription is named 'nobody'" in unknown.stderr
    finally:
        code, err = served.terminate()
    assert code == 0, err

    # the marks and the filter are durable: a restarted service lists the same
    served = start_serve([str(cluster / "dn1.pgstream"), str(cluster / "dn2.pgstream")], log, *serve_args)
    try:
        assert listed(served, tmp_path)[0][:2] == ["billing", str(csn[2])]
        assert listed(served, tmp_path)[0][4] == "public.acct"
        metrics = http(served, "metrics")
        assert 'csnd_subscriber_lag_transactions{subscriber="billing"}' in metrics

        # a name a consumer holds is neither reset nor deleted
        holder = subprocess.Popen(
            [*CSND, "subscribe", served.address, "--name", "live", "--idle-timeout", "600", *sub],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(
                lambda: any(
                    r[0] == "live" and r[3].startswith("connected") for r in listed(served, tmp_path)
                ),
                "live",
            )
            busy = manage("delete", served.address, "live", tmp=tmp_path)
            assert (
                busy.returncode == 1 and "is connected" in busy.stderr and "stop its consumer" in busy.stderr
            )
            busy = manage("reset", served.address, "live", "--csn", "0", tmp=tmp_path)
            assert busy.returncode == 1 and "is connected" in busy.stderr
        finally:
            holder.terminate()
            holder.wait(60)
        wait_for(
            lambda: any(r[0] == "live" and r[3] == "idle" for r in listed(served, tmp_path)), "live idle"
        )

        for name in ("billing", "live"):
            gone = manage("delete", served.address, name, tmp=tmp_path)
            assert gone.returncode == 0, gone.stderr
            assert f"deleted subscription {name}" in gone.stderr
        assert listed(served, tmp_path) == []
        assert "billing" not in consumers(served) and "live" not in consumers(served)
        metrics = http(served, "metrics")
        assert "csnd_subscriber_lag_transactions{" not in metrics
        assert 'subscriber="billing"' not in metrics
    finally:
        code, err = served.terminate()
    assert code == 0, err
    stored = json.loads((tmp_path / "log" / "subscriptions.json").read_text())
    assert stored == {"subscriptions": {}, "version": 1}
