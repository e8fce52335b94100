"""An example Django project (and a small Flask app) on a sharded Sentinel cache.

``make demo`` runs :mod:`example_project.demo` (a scripted tour against a local topology);
``make run`` runs :mod:`example_project.run` (the same project for a person to click through).
The project is configured only through ``settings.py``, which reads the topology from the
environment (see :mod:`example_project.topology`).
"""
