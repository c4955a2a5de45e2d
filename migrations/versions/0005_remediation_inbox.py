"""remediation inbox: accepted triggers survive a crash of the engine

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:00:00

``remediation_inbox`` holds every trigger the engine accepted (the webhook answers 202 only after
it is committed) until it is decided.  The decision claims the delivery key, writes its audit row
and removes the inbox entry in one transaction, so a crash at any point leaves either the inbox
entry (decided on restart) or the decision (a re-delivery is a duplicate).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('remediation_inbox',
    sa.Column('key', sa.String(length=512), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('rule', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('event', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    with op.batch_alter_table('remediation_inbox', schema=None) as batch_op:
        batch_op.create_index('ix_remediation_inbox_ts', ['ts'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('remediation_inbox', schema=None) as batch_op:
        batch_op.drop_index('ix_remediation_inbox_ts')

    op.drop_table('remediation_inbox')
