"""verdict_runs: the verdict history, one row per run of an accelerator's published state

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 23:40:00

Each row is a run of one accelerator's state as the agent published it (``triscope_mismatch_state``):
accelerator, the workload the verdict named, state, first and last tick, ticks, score sum and max.
Written as ticks are written (store/verdicts.py); root cause and the pages read it at full
resolution whatever the look-back.  See docs/workloads.md section 3.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('verdict_runs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('accelerator', sa.String(length=64), nullable=False),
    sa.Column('namespace', sa.String(length=253), nullable=False),
    sa.Column('pod', sa.String(length=253), nullable=False),
    sa.Column('container', sa.String(length=253), nullable=False),
    sa.Column('workload', sa.String(length=253), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('start_ts', sa.Float(), nullable=False),
    sa.Column('end_ts', sa.Float(), nullable=False),
    sa.Column('ticks', sa.Integer(), nullable=False),
    sa.Column('score_sum', sa.Float(), nullable=False),
    sa.Column('score_max', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('verdict_runs', schema=None) as batch_op:
        batch_op.create_index('ix_verdict_runs_node_end', ['node_id', 'end_ts'], unique=False)
        batch_op.create_index('ix_verdict_runs_node_acc_end', ['node_id', 'accelerator', 'end_ts'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('verdict_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_verdict_runs_node_acc_end')
        batch_op.drop_index('ix_verdict_runs_node_end')

    op.drop_table('verdict_runs')
