"""The loader advisor, pure: the throughput model and its fit (``model``), the advice and its
verification config (``advise``), the interference map (``interference_map``), the score of
predictions against measurements (``verify``), and the config sections it reads (``settings``).

Tables in, tables and advice out; the files are ``codl.steps.advisor``'s, the figures
``codl.figures``'.
"""
