from __future__ import annotations

import os
import sys

from django.core.exceptions import ImproperlyConfigured
from django.core.wsgi import get_wsgi_application

from .env import one_line

os.environ.setdefault("DJANGO_SETTINGS_MODULE", f"{__package__}.settings")

# gunicorn's master has loaded the settings already (config/gunicorn.conf.py) and imports this
# module before it forks the web processes (preload_app); what is left to fail here is setting
# up the apps (an unknown TASKDESK_TOOLSETS name). The master says so in one line and exits
# with gunicorn's "application failed to load" status before any web process starts.
try:
    application = get_wsgi_application()
except ImproperlyConfigured as error:
    print(one_line(error), file=sys.stderr, flush=True)
    sys.exit(4)
