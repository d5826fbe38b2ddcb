"""The application around the engine: the worker that claims and runs tasks (``worker``,
``best_decision``), the service that starts the API and the workers and supervises them
(``service``, ``supervision``), the dispatchers that hand tasks to workers (``dispatch``), and
the ``tuner`` command line (``cli``, ``cli_commands``, ``cli_service``, ``cli_common``,
``sweep``, ``tune_report``).

It sits above the engine core (``tuner/``: search, measurement, backends, kernels' protocol),
the store (``db``) and the kernels (``search_spaces``); nothing below imports it
(``tests/test_layers.py``)."""
