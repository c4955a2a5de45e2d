"""``triscope agent --budget-file FILE``: the sample budget (``triscope.agent.budget``) as a YAML file.

```yaml
total_samples: 4096          # every sender together (OTLP and scrape targets), samples a tick
sender_samples: 2048         # each sender, unless named below
idle: 10m                    # a scraped series absent this long gives its samples back
senders:                     # a sender's own budget, samples a tick (instead of sender_samples)
  http://127.0.0.1:8000/metrics: 3000   # a --scrape target: its URL as written on --scrape
  vllm: 1000                            # an OTLP sender: its service.name, from any address
  infer@10.0.0.7: 500                   # ... from that address only
```

Read at start by the project's YAML loader and a pydantic model (imported only when a file is
given); an error is one line, ``FILE:LINE: field: what is wrong``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from triscope.agent.budget import DEFAULT_IDLE_S, DEFAULT_SENDER_SAMPLES, DEFAULT_TOTAL_SAMPLES, BudgetOptions
from triscope.core import yamlsafe
from triscope.core.configfile import ConfigFileError, ConfigModel, validate
from triscope.core.durations import Duration

Samples = Annotated[int, Field(ge=0, le=10_000_000)]


class BudgetFile(ConfigModel):
    total_samples: Samples = DEFAULT_TOTAL_SAMPLES
    sender_samples: Samples = DEFAULT_SENDER_SAMPLES
    idle: Duration = DEFAULT_IDLE_S
    senders: dict[Annotated[str, Field(min_length=1, max_length=1000)], Samples] = Field(default_factory=dict)


def load(path: str) -> BudgetOptions:
    """The budget in ``path``; ``ConfigFileError`` (file, line, reason) for a bad one."""
    try:
        doc = yamlsafe.load(path)
    except yamlsafe.YAMLFileError as e:
        raise ConfigFileError(e.file, e.line, e.reason) from None
    if doc.root is None:
        doc.root = {}
    m = validate(BudgetFile, doc)
    return BudgetOptions(total_samples=m.total_samples, sender_samples=m.sender_samples, senders=dict(m.senders),
                         idle_s=m.idle, file=path)
