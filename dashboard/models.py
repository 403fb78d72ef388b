# The dashboard has no models: it draws the engine worker's live snapshots (dashboard/feed.py).
