"""Claims a skeptic can recompute: every headline number of the README and the results pages
is a row of ``docs/claims.yaml`` (its statistic, interval, runs, blocks, invocations, and the
expression that computes it from a committed table), cited in the text between markers that
``codl claims render`` rewrites and ``codl claims check`` verifies.

The modules: ``registry`` (the rows and how a number reads), ``compute`` (a row's number from
its tables), ``text`` (citations in Markdown), ``check`` (the whole checkout). Nothing is
imported here: ``codl`` builds its parser from ``codl.claims.cli`` on every start, and pandas
would cost every ``codl run`` half a second."""
