"""Alembic environment: SQLite (batch mode) and PostgreSQL."""

from __future__ import annotations

from alembic import context

from triscope.store.db import make_engine
from triscope.store.schema import metadata as target_metadata_all

config = context.config
target_metadata = target_metadata_all


def _include_name(name, type_, parent_names):
    # the daily partitions of the raw samples (PostgreSQL) are not models: see store/partitions.py
    from triscope.store.partitions import is_partition_name

    return not (type_ == "table" and is_partition_name(name))


def _include_object(dialect: str):
    # samples is a view on PostgreSQL and sample_rows exists only there (store/models.py)
    from triscope.store.models import NOT_ON

    def include(obj, name, type_, reflected, compare_to):
        return not (type_ == "table" and name == NOT_ON.get(dialect))
    return include


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=connection.dialect.name == "sqlite",
                          include_name=_include_name, include_object=_include_object(connection.dialect.name))
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
