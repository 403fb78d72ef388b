from django.urls import path

from .consumers import LanesConsumer

websocket_urlpatterns = [
    path("ws/dashboard/", LanesConsumer.as_asgi()),
]
