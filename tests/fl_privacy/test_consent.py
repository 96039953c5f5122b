import numpy as np
import pytest

from plinth.fl.privacy.consent import ConsentRegistry


def test_grant_revoke_and_selection(tmp_path):
    reg = ConsentRegistry(str(tmp_path / "consent.db"))
    reg.grant("a", "next-word", version=2, now=10.0)
    reg.grant("b", "next-word", version=1, now=11.0)
    reg.grant("c", "ads", version=3, now=12.0)
    e = reg.eligible(["a", "b", "c", "d"], "next-word", now=20.0, task_id="t1", round=1)
    assert e.eligible == ["a", "b"]
    assert "no live consent" in e.excluded["c"] and "no live consent" in e.excluded["d"]
    assert reg.eligible(["a", "b"], "next-word", now=20.0, min_version=2).eligible == ["a"]
    assert reg.consent_version("a", "next-word", now=5.0) is None  # before the grant
    assert reg.revoke("a", "next-word", now=30.0)
    assert not reg.revoke("a", "next-word", now=31.0)
    assert reg.eligible(["a", "b"], "next-word", now=40.0).eligible == ["b"]
    assert reg.consent_version("a", "next-word", now=25.0) == 2  # history stays queryable
    reg.record_participation("b", "next-word", task_id="t1", round=2, now=41.0)
    with pytest.raises(ValueError, match="no live consent"):
        reg.record_participation("a", "next-word", task_id="t1", round=2, now=41.0)
    events = [(x.client_id, x.event) for x in reg.audit_log(purpose="next-word")]
    assert (
        ("a", "granted") in events
        and ("a", "revoked") in events
        and ("b", "participated") in events
    )
    assert [x.event for x in reg.audit_log(client_id="b", event="participated")] == ["participated"]
    assert len(reg.audit_log(since=30.0, until=31.0)) == 1
    reg.close()
    # Persistent: a reopened registry remembers.
    reg2 = ConsentRegistry(str(tmp_path / "consent.db"))
    assert reg2.eligible(["a", "b"], "next-word", now=50.0).eligible == ["b"]


def test_regrant_supersedes_and_bad_input():
    reg = ConsentRegistry()
    reg.grant("a", "p", version=1, now=1.0)
    reg.grant("a", "p", version=2, now=2.0)
    assert reg.consent_version("a", "p", now=3.0) == 2
    with pytest.raises(ValueError, match="version"):
        reg.grant("a", "p", version=0, now=4.0)
    with pytest.raises(ValueError, match="non-empty"):
        reg.grant("", "p", version=1, now=4.0)


def test_select_never_picks_without_consent():
    reg = ConsentRegistry()
    for i in range(0, 40, 2):
        reg.grant(f"c{i}", "p", version=1, now=0.0)
    reg.revoke("c0", "p", now=1.0)
    rng = np.random.default_rng(0)
    everyone = [f"c{i}" for i in range(40)]
    for r in range(20):
        picked = reg.select(everyone, "p", k=8, rng=rng, now=2.0 + r, task_id="t", round=r)
        assert len(picked) == 8
        assert all(int(c[1:]) % 2 == 0 and c != "c0" for c in picked)
    assert len(reg.audit_log(event="selected", task_id="t")) == 160
