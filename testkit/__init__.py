"""What the tests and the benchmarks share: starting the real server (``manage.py serve``) on a
free port, stopping child processes, the headless browser's command line. Neither tests/ nor
bench/ owns it; both import it."""
