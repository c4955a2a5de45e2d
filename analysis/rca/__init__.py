"""Root cause: one package, one scorer (docs/analysis.md, "Root cause").

* ``timeline`` — ``rca_timeline``: what ``triscope rca`` answers, the node's window as episodes
  (the verdict history's runs), each bad one explained;
* ``ranked`` — ``rank_causes``: one ranked list of what changed in a window against a baseline
  (``triscope rca --ranked``, the dashboard's explain);
* ``score`` — ``score_cause``, the one cause score both use; ``context`` — what is shown beside
  the causes and never ranked (application SLIs, remediation actions, the agent itself, a scrape
  target's late ``/metrics``);
* ``explain``, ``phases``, ``reference``, ``slo`` — an episode's causes, its phases, what it is
  compared with, the SLO burns linked to it;
* ``evidence``, ``changes``, ``categories``, ``noise``, ``inputs`` — the absolute figures, what
  moved, the cause families, the noise floors, the reads.
"""
