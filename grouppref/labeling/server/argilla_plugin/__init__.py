"""Code that runs inside argilla-server's own virtual environment (see ``launch.py``).

Not importable from grouppref's environment (it needs ``argilla_server``); the launcher runs
by path, with this directory first on ``sys.path``.
"""
