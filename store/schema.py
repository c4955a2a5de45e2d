"""Import every model module so ``Base.metadata`` holds the whole schema (Alembic, tests)."""

from triscope.store import audit, models, workloads  # noqa: F401
from triscope.store.models import Base

# Parts that add tables import their model modules here, e.g. ``from store import audit``.

metadata = Base.metadata
