"""etforge's own memos are caches: a damaged one is a miss (set aside with one warning), never a
wedge. The digest memo (artifacts/.etforge/digests.json: file digests, kept parses of
pipeline.yaml, import records) and the matrix-wide stages' content keys."""

from __future__ import annotations

import hashlib
import json

import pytest

from etforge.cache.content_keys import MEMO_FILE, ContentKeys
from etforge.config.digest_cache import PROJECT_MEMO, digest_cache_for, read_memo
from etforge.config.resolve import resolve
from etforge.config.validation_memo import PARSED
from unit.support import task_keys


def _resolved(project):
    digests = digest_cache_for(project.pipeline)
    plan = resolve(project.pipeline, digests)
    digests.save()
    return plan


def _rewrite_body(memo, change) -> None:
    """Change the memo's body and give it a matching checksum: well-formed, but not what etforge wrote."""
    header, body = memo.read_text().split("\n", 1)
    data = change(json.loads(body))
    body = json.dumps(data)
    head = json.loads(header)
    head["sha256"] = hashlib.sha256(body.encode()).hexdigest()
    memo.write_text(json.dumps(head) + "\n" + body + "\n")


def _flip_first_brace_of_the_kept_parse(memo) -> None:
    """The red team's damage: one character of a kept parse, the outer JSON left valid."""
    text = memo.read_text()
    start = text.index('"parsed-yaml"')
    brace = text.index("{\\", start)  # the first "{" inside the kept (escaped) JSON text
    memo.write_text(text[:brace] + "[" + text[brace + 1 :])


DAMAGES = {
    "flipped character in a kept parse": _flip_first_brace_of_the_kept_parse,
    "kept parse replaced by an object": lambda memo: _rewrite_body(
        memo, lambda d: {**d, "derived": {**d["derived"], PARSED: dict.fromkeys(d["derived"][PARSED], {"a": 1})}}
    ),
    "kept parse of another file": lambda memo: _rewrite_body(
        memo,
        lambda d: {
            **d,
            "derived": {
                **d["derived"],
                PARSED: dict.fromkeys(d["derived"][PARSED], json.dumps({"data": [1], "lines": []})),
            },
        },
    ),
    "nested 100000 deep": lambda memo: memo.write_text("[" * 100_000 + "]" * 100_000),
    "truncated": lambda memo: memo.write_bytes(memo.read_bytes()[:100]),
    "binary": lambda memo: memo.write_bytes(bytes(range(256)) * 8),
    "file table of the wrong type": lambda memo: _rewrite_body(memo, lambda d: {**d, "files": [1, 2]}),
    "file entries of the wrong shape": lambda memo: _rewrite_body(
        memo, lambda d: {**d, "files": {path: [1] for path in d["files"]}}
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_digest_memo_is_a_miss_and_the_plan_is_the_same(unit_project, damage, capfd):
    keys = task_keys(_resolved(unit_project))
    memo = unit_project.root / PROJECT_MEMO
    DAMAGES[damage](memo)
    capfd.readouterr()
    assert task_keys(_resolved(unit_project)) == keys
    warned = capfd.readouterr().err
    assert warned.count("etforge: warning:") <= 1, warned  # at most one line, and the plan is whole
    assert read_memo(memo).files  # written afresh
    again = capfd.readouterr()
    assert task_keys(_resolved(unit_project)) == keys
    assert "warning" not in capfd.readouterr().err + again.err


def test_a_damaged_memo_is_set_aside_once_with_one_warning(unit_project, capfd):
    _resolved(unit_project)
    memo = unit_project.root / PROJECT_MEMO
    _flip_first_brace_of_the_kept_parse(memo)
    capfd.readouterr()
    _resolved(unit_project)
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "digests.json: its checksum does not match its content" in err, err
    assert memo.with_name("digests.json.damaged").is_file()


@pytest.mark.parametrize(
    "text", ["[" * 100_000 + "]" * 100_000, '{"manifest": 5}', '{"manifest": {"key": ["x"]}}', "\xff\xfe"]
)
def test_damaged_content_keys_are_misses(tmp_path, text, capfd):
    path = tmp_path / MEMO_FILE
    path.write_text(text, encoding="latin-1")
    keys = ContentKeys(path)
    assert keys.get("manifest", "inputs", "files") is None
    keys.keep("manifest", "inputs", "files", "k" * 64)
    assert ContentKeys(path).get("manifest", "inputs", "files") == "k" * 64
    assert capfd.readouterr().err.count("etforge: warning:") <= 1


def test_damaged_pending_uploads_are_reminders_of_nothing(tmp_path):
    """artifacts/.etforge/pending-uploads/ holds one empty file per key owed to a writable remote:
    names that are no key, a directory in a file's place, a key with no entry are dropped."""
    from etforge.cache.remote import remote_from_url
    from etforge.cache.store import PENDING, Store

    (tmp_path / "remote").mkdir()
    store = Store(
        tmp_path / "cache", remote=remote_from_url(f"file://{tmp_path / 'remote'}"), state_dir=tmp_path / "state"
    )
    pending = tmp_path / "state" / PENDING
    pending.mkdir(parents=True)
    (pending / "..escape").touch()
    (pending / ("a" * 64)).mkdir()
    (pending / ("b" * 64)).touch()
    assert store.upload_pending() == 0
    assert not any(pending.iterdir())
