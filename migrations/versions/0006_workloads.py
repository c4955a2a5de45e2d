"""workloads: the owning workload of each pod, resolved by the remediation engine

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 14:00:00

``workloads`` holds one row per (namespace, pod): the owner the engine resolved through
ownerReferences (``Deployment`` through the ReplicaSet, ``StatefulSet``, ``DaemonSet``, ``Job``,
else ``Pod``) and when.  The agent labels series with the pod only (it has no Kubernetes API
access); the dashboard groups by this table, and the engine reads it back for alerts that carry
only a pod.  See docs/workloads.md.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('workloads',
    sa.Column('namespace', sa.String(length=253), nullable=False),
    sa.Column('pod', sa.String(length=253), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('resolved_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('namespace', 'pod')
    )
    with op.batch_alter_table('workloads', schema=None) as batch_op:
        batch_op.create_index('ix_workloads_owner', ['namespace', 'kind', 'name'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('workloads', schema=None) as batch_op:
        batch_op.drop_index('ix_workloads_owner')

    op.drop_table('workloads')
