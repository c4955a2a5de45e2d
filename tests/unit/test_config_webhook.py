"""The Alertmanager webhook payload as a pydantic model (``WebhookPayload``): what it accepts
(Alertmanager's real payload, read into the model the engine takes) and the one short line each refusal gives
(the HTTP 400 body; the HTTP side is in test_remediation_webhook / test_faults_webhook)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kube_server import alert_payload

from triscope.remediation.webhook import MAX_ALERTS, PayloadError, validate_payload

GOOD = alert_payload([{"labels": {"alertname": "Storm", "node": "n1"}, "annotations": {"summary": "s"}}])


def test_a_real_payload_is_read_into_the_model() -> None:
    body = copy.deepcopy(GOOD)
    body["someFutureField"] = {"nested": [1, 2]}            # a newer Alertmanager may send more: ignored
    body["alerts"][0]["endsAt"] = "0001-01-01T00:00:00Z"
    p = validate_payload(body)
    a = p.alerts[0]
    assert (a.status, a.labels, a.endsAt, a.generatorURL) == ("firing", {"alertname": "Storm", "node": "n1"},
                                                              "0001-01-01T00:00:00Z", "http://prometheus/graph")
    # startsAt is read once, here: as Alertmanager wrote it (the delivery key) and as epoch seconds (nanoseconds cut)
    assert a.startsAt.text == "2026-11-29T18:00:00.123456789Z" and a.startsAt.ts == 1795975200.123456
    body["version"] = 4                                       # a number is read as "4" too
    assert validate_payload(body).version == "4"
    many = copy.deepcopy(GOOD)
    many["alerts"] = many["alerts"] * MAX_ALERTS
    assert len(validate_payload(many).alerts) == MAX_ALERTS


def change(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(GOOD)
    cur: Any = body
    for key in path[:-1]:
        cur = cur[key]
    if value is KeyError:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return body


@pytest.mark.parametrize("path, value, message", [
    (("version",), "3", "version: unsupported webhook payload version '3' (expected \"4\")"),
    (("version",), KeyError, "version: missing (required)"),
    (("alerts",), [], "alerts: must be a non-empty list"),
    (("alerts",), {"a": 1}, "alerts: must be a non-empty list"),
    (("alerts",), [GOOD["alerts"][0]] * (MAX_ALERTS + 1), "alerts: too many alerts in one payload (1001 > 1000)"),
    (("alerts", 0), "x", "alerts[0]: must be an object, not 'x'"),
    (("alerts", 0, "status"), "burning", "alerts[0].status: must be 'firing' or 'resolved', not 'burning'"),
    (("alerts", 0, "labels"), ["alertname"], "alerts[0].labels: must be an object, not ['alertname']"),
    (("alerts", 0, "labels", "n"), 1, "alerts[0].labels.n: must be a string, not 1"),
    (("alerts", 0, "labels", "alertname"), "", "alerts[0].labels: has no alertname"),
    (("alerts", 0, "annotations", "deep"), {"a": {"b": "c"}}, "alerts[0].annotations.deep: must be a string, not an object"),
    (("alerts", 0, "startsAt"), "yesterday", "alerts[0].startsAt: must be an RFC 3339 time, not 'yesterday'"),
    (("alerts", 0, "startsAt"), "2026-11-29T18:00:00", "alerts[0].startsAt: must be an RFC 3339 time"),
    (("alerts", 0, "startsAt"), KeyError, "alerts[0].startsAt: missing (required)"),
    (("alerts", 0, "fingerprint"), "f" * 65, "alerts[0].fingerprint: must be at most 64 characters long"),
    (("commonLabels",), {"a": ["b"]}, "commonLabels.a: must be a string, not ['b']"),
    (("groupLabels",), "x", "groupLabels: must be an object, not 'x'"),
])
def test_refusals_are_one_short_line(path: tuple[Any, ...], value: Any, message: str) -> None:
    with pytest.raises(PayloadError) as ei:
        validate_payload(change(path, value))
    msg = str(ei.value)
    assert msg.startswith(message), msg
    assert "\n" not in msg and len(msg) <= 300 and "pydantic" not in msg and "Input should" not in msg


def test_not_an_object_and_long_values() -> None:
    with pytest.raises(PayloadError, match=r"^the body must be a JSON object \(Alertmanager webhook payload\)$"):
        validate_payload([GOOD])
    with pytest.raises(PayloadError) as ei:
        validate_payload(change(("alerts", 0, "status"), "x\n" * 10_000))
    assert len(str(ei.value)) <= 300 and "\n" not in str(ei.value)
