"""A body with the last one's skeleton (the same lines, new values) is read without a Python step per
line (issue 46, item 2: ``promtext._Skeleton``); whatever differs from the last body in any other
way is read by the walk, so the samples and errors stay prometheus-client's.  The reference is the
one of test_scrape_cache: prometheus-client's own parser with the agent's rules."""

from __future__ import annotations

import pytest

from tests.integration.test_scrape_cache import ROUTES, URL, exposition, reference, stored
from triscope.agent.budget import BudgetOptions, SampleBudget, ScrapeLedger
from triscope.agent.collectors.scrape import ScrapeCollector, ScrapeError, _spans


def _values(body: str, new: str, only: str | None = None) -> str:
    """``body`` with every sample line's value (or only the line starting with ``only``'s) set to ``new``."""
    out = []
    for line in body.split("\n"):
        if line and line[0] != "#" and (only is None or line.startswith(only)):
            line = f"{line.rpartition(' ')[0]} {new}"
        out.append(line)
    return "\n".join(out)


def test_values_moved_are_read_through_the_skeleton_and_stored_as_the_parser_reads_them() -> None:
    c = ScrapeCollector(URL)
    first = exposition((0.1, 1.0), ROUTES, 5, 0.05)
    assert stored(c, first) == reference(first)
    assert c._text and c._text.skeleton_walks == 0
    for i, body in enumerate([exposition((0.1, 1.0), ROUTES, 9, 0.2), exposition((0.1, 1.0), ROUTES, 0, 0.3),
                              _values(first, "1e3"), _values(first, "-0.5")]):
        assert stored(c, body) == reference(body), i
        assert c._text.skeleton_walks == i + 1
    assert c.last_path == "cached"


@pytest.mark.parametrize(("change", "why"), [
    (lambda b: _values(b, "1_0", "app_queue"), "an underscore in a value"),
    (lambda b: _values(b, "0x10", "app_queue"), "no float"),
    (lambda b: _values(b, "", "app_queue"), "no value"),
    (lambda b: _values(b, "NaN", "app_queue"), "a value that became NaN"),
    (lambda b: _values(b, "+Inf", "app_requests_total"), "a counter that became +Inf"),
    (lambda b: _values(b, "1 1700000000000", "app_queue"), "a timestamp after the value"),
    (lambda b: b.replace("# TYPE app_queue gauge", "# TYPE app_queue counter"), "a type changed"),
    (lambda b: b.replace("# HELP app_queue Queue", "# HELP app_queue Queue now"), "a help text changed"),
    (lambda b: b.replace("\n# TYPE app_queue gauge", "\n\n# TYPE app_queue gauge"), "a blank line added"),
    (lambda b: b.replace('app_queue{model="/v1/completions"}', 'app_queue{model="/v1/other"}'), "a label changed"),
    (lambda b: b.replace('app_queue{model="/v1/completions"} 0.0', 'app_queue{model="/v1/completions"}  0.0'),
     "two spaces before a value"),
    (lambda b: b.replace('app_queue{model="/v1/completions"} 0.0', ' app_queue{model="/v1/completions"} 0.0'),
     "a line indented"),
    (lambda b: b.replace('app_queue{model="/v1/completions"} 0.0', 'app_queue{model="/v1/completions" 0.0'),
     "a broken label set"),
])
def test_anything_but_new_values_is_read_by_the_walk(change, why) -> None:
    """Each change after a body read through the skeleton stores (or fails) as the parser reads it,
    and the body after it is read right again."""
    c = ScrapeCollector(URL)
    a = exposition((0.1, 1.0), ROUTES, 5, 0.05)
    b = exposition((0.1, 1.0), ROUTES, 6, 0.1)
    assert stored(c, a) == reference(a)
    assert stored(c, b) == reference(b)
    assert c._text and c._text.skeleton_walks == 1
    odd = change(b)
    assert odd != b, why
    assert stored(c, odd) == reference(odd), why
    assert c._text.skeleton_walks == 1, why
    again = exposition((0.1, 1.0), ROUTES, 7, 0.2)
    assert stored(c, again) == reference(again), why


def test_a_nan_where_there_was_one_stays_out_and_a_number_there_comes_in() -> None:
    """An empty summary's NaN quantiles: left out through the skeleton too; when one becomes a number
    the body is walked and the quantile stored."""
    body = '# TYPE s summary\ns{quantile="0.5"} NaN\ns_count 0\ns_sum 0\n# TYPE g gauge\ng 1\n'
    c = ScrapeCollector(URL)
    assert stored(c, body) == reference(body)
    moved = body.replace("g 1", "g 2").replace("s_count 0", "s_count 3")
    assert stored(c, moved) == reference(moved)
    assert c._text and c._text.skeleton_walks == 1
    filled = moved.replace("NaN", "0.25")
    assert stored(c, filled) == reference(filled)
    assert ("s", 0.25, (("instance", "127.0.0.1:9"), ("job", "scrape"), ("quantile", "0.5")), "gauge") in stored(
        c, filled)
    assert c._text.skeleton_walks == 1


def test_an_integer_past_a_float_is_a_clear_error_after_the_skeleton_too() -> None:
    """prometheus-client keeps such a value an int, which no float holds: the scrape fails saying so
    (before, an OverflowError escaped the collector), through the skeleton or not."""
    a = exposition((0.1, 1.0), ROUTES, 5, 0.05)
    b = exposition((0.1, 1.0), ROUTES, 6, 0.1)
    huge = _values(b, "9" * 400, "app_queue")
    warm = ScrapeCollector(URL)
    for body in (a, b):
        stored(warm, body)
    assert warm._text and warm._text.skeleton_walks == 1
    for c in (warm, ScrapeCollector(URL)):
        with pytest.raises(ScrapeError, match="malformed Prometheus text: the value of app_queue is out of a float's"):
            c.parse(huge)
    assert stored(warm, b) == reference(b)


def test_the_budget_holds_whole_histograms_through_the_skeleton() -> None:
    """With a budget, each histogram's label set (its buckets, _count and _sum) is one group, held
    whole or not at all, at the first scrape and through the skeleton (groups as slices)."""
    budget = SampleBudget(BudgetOptions(total_samples=20, sender_samples=20))
    c = ScrapeCollector(URL, ledger=ScrapeLedger(budget, URL))
    for k in (1, 2, 3):
        body = exposition((0.1, 1.0), ROUTES, k, 0.1 * k)
        got = [(s.name, s.value, tuple(sorted(s.labels.items())), s.kind) for s in c.parse(body)]
        want = reference(body)
        assert len(want) == 21 and want[-1][0] == "app_queue"
        assert got == want[:-1], k       # 3 counters + 3 histograms of 5 + 2 gauges: the third gauge is refused
    assert c._text and c._text.skeleton_walks == 2


def test_a_group_whose_samples_are_apart_is_still_one_group() -> None:
    """A summary whose quantiles and counts are written apart: each label set is one group all the same."""
    budget = SampleBudget(BudgetOptions(total_samples=3, sender_samples=3))
    c = ScrapeCollector(URL, ledger=ScrapeLedger(budget, URL))
    for v in (1, 2):
        body = (f'# TYPE s summary\ns{{quantile="0.5",a="1"}} {v}\ns{{quantile="0.5",a="2"}} {v}\n'
                f's_count{{a="1"}} {v}\ns_count{{a="2"}} {v}\n')
        got = [(s.name, s.labels["a"]) for s in c.parse(body)]
        assert got == [("s", "1"), ("s_count", "1")], v
    assert c._text and c._text.skeleton_walks == 1
    assert _spans([("a", ()), ("a", ()), ("b", ()), ("a", ())]) is None
    assert _spans([("a", ()), ("a", ()), ("b", ())]) == [(("a", ()), 0, 2), (("b", ()), 2, 3)]
