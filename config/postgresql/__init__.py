"""Django's PostgreSQL backend with the connection health check made only after idleness
(``base.DatabaseWrapper``)."""
