"""``auto_cmdline``'s compiled forms (memagent.config.auto): globs translated for RE2 match
what fnmatch matches; patterns are refused by structure, the same every time."""

from __future__ import annotations

import fnmatch
import time

import pytest

from memagent.config.auto import MAX_CMDLINE, MAX_PROGRAM, compile_cmdline, parse_template

LINES = ["python3 serve.py --port 1", "python3 /x/serve.py", "a[x", "xxcbq", "zax", "a\\b", "serve.py",
         "python -m serve_bert", "tab\tand\nnewline serve.py"]
GLOBS = ["*serve.py*", "serve.py*", "*[!a]b?", "*[ab]x", "*[x", "*a\\b*", "serve.py", "*serve_bert",
         "*[]]*", "*[!]]", "?erve.py*", "*.py"]


@pytest.mark.parametrize("glob", GLOBS)
def test_a_glob_matches_what_fnmatch_matches_at_an_argument(glob: str) -> None:
    pattern = compile_cmdline(glob)
    for line in LINES:
        if glob.startswith("*"):
            expected = fnmatch.fnmatchcase(line, glob)
        else:
            starts = [0] + [i + 1 for i, c in enumerate(line) if c == " "]
            expected = any(fnmatch.fnmatchcase(line[i:], glob) for i in starts)
        assert (pattern.search(line) is not None) == expected, (glob, line)


def test_groups_are_those_of_a_search_leftmost_first() -> None:
    p = compile_cmdline(r"re:serve_(?P<model>\w+)\.py (\S*)")
    assert p.search("python3 /x/serve_bert.py tag x") == {"0": "serve_bert.py tag", "1": "bert", "2": "tag",
                                                          "model": "bert"}
    assert compile_cmdline(r"re:(a|ab)(c|bcd)(d*)").search("abcd") == {"0": "abcd", "1": "a", "2": "bcd", "3": ""}
    assert p.group_names == {"0", "1", "2", "model"}


@pytest.mark.parametrize(("text", "says"), [
    (r"re:(\w+)\.py \1", "invalid escape sequence"),
    (r"re:(?=serve)x", "invalid perl operator"),
    (r"re:(?<!x)y", "invalid perl operator"),
    ("re:a{1001}", "invalid repetition size"),
    ("re:([ab]*)a([ab]{390})", f"at most {MAX_PROGRAM}"),
])
def test_what_re2_cannot_do_in_linear_time_is_refused_in_one_line(text: str, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        compile_cmdline(text)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_the_issues_patterns_are_accepted_every_time_and_fast_on_a_crafted_line() -> None:
    """No timing probe: ``re:(\\w+)\\.py`` is accepted 20 times out of 20; the issue's
    ``--gpus`` pattern is accepted and matches a crafted 1 KiB line in well under a ms
    (Python's re took minutes at 68 characters)."""
    for _ in range(20):
        compile_cmdline.cache_clear()
        compile_cmdline(r"re:(\w+)\.py")
    gpus = compile_cmdline(r"re:--gpus[= ]((?:\d|,|\d,)*) ")
    line = ("python3 x.py --gpus " + "1," * MAX_CMDLINE)[:MAX_CMDLINE - 1] + "X"
    started = time.process_time()
    for _ in range(100):
        assert gpus.search(line) is None
    assert time.process_time() - started < 1.0  # 100 matches: ~1 ms here; 1 s only on a crawling box


def test_a_label_is_made_of_root_facts_only_with_a_placeholder_that_has_them() -> None:
    facts = frozenset({"container", "unit"})
    values = {"comm": "python3", "container": "web", "unit": None, "1": "prod"}
    assert parse_template("{container}").made_of(values, facts)
    assert parse_template("bert-{container|unit}").made_of(values, facts)
    assert not parse_template("{unit}").made_of(values, facts)  # no value: the comm stands in
    assert not parse_template("{1}").made_of(values, facts)
    assert not parse_template("prod-llm").made_of(values, facts)  # fixed text: the match is the user's
    assert not parse_template("{container}").made_of(values, frozenset())  # a user's manager's cgroup
