from __future__ import annotations

from django.urls import path

from tasks_app.authserver import views

urlpatterns = [
    path(
        ".well-known/oauth-authorization-server",
        views.authorization_server_metadata,
        name="oauth_authorization_server",
    ),
    path("oauth/authorize", views.authorize, name="oauth_authorize"),
    path("oauth/token", views.token, name="oauth_token"),
    path("oauth/register", views.register, name="oauth_register"),
    path("oauth/revoke", views.revoke, name="oauth_revoke"),
]
