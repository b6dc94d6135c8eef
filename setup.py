"""The wheel's packages (the rest of the metadata is pyproject.toml's).

The repository's settings package, ``config/``, ships as ``taskdesk``: installed next to a
Django project whose own settings package is named ``config`` (the name ``startproject``
guides see most), it cannot replace it or be replaced by it. Its code names itself by
``__package__`` (tasks_app reaches it through ``settings.SETTINGS_PACKAGE``), so the
checkout keeps ``config`` (manage.py, the Procfile, ``celery -A config``). The apps keep their
names, which are their Django app labels and the names tool authors import
(``tasks_app.tools``, ``tasks_app.testing``). ``templates/`` and ``static/`` ship inside
``taskdesk`` as package data, where the settings look for them once installed.
"""

from __future__ import annotations

from setuptools import find_packages, setup

SETTINGS_PACKAGE = "taskdesk"
APPS = find_packages(include=["tasks_app", "tasks_app.*", "elicitations", "elicitations.*"])
SETTINGS = [SETTINGS_PACKAGE, *(f"{SETTINGS_PACKAGE}.{name}" for name in find_packages("config"))]
DATA = {f"{SETTINGS_PACKAGE}.templates": "templates", f"{SETTINGS_PACKAGE}.static": "static"}

setup(
    packages=[*APPS, *SETTINGS, *DATA],
    package_dir={SETTINGS_PACKAGE: "config", **DATA},
    package_data={
        "": ["py.typed"],
        **{package: ["**/*"] for package in DATA},
    },
    # Only what package_data names: the repository's other files stay out of the wheel.
    include_package_data=False,
)
