# The dashboard has no models; its page is /dashboard/ (dashboard/views.py).
