"""Start the example Django project in this process, as ``runserver`` serves it, on a thread.

Used by the demo (a real HTTP path on a free loopback port) and by ``make run``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from example_project import topology


def setup_django(sentinels: list[str], masters: list[str], *, database: str) -> None:
    """Point the settings at a topology, configure Django, and create the user tables."""
    topology.export(sentinels, masters)
    os.environ["EXAMPLE_DATABASE"] = database
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    import django
    from django.core.management import call_command

    Path(database).parent.mkdir(parents=True, exist_ok=True)
    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def ensure_user(username: str, password: str) -> None:
    from django.contrib.auth import get_user_model

    users = get_user_model()
    user = users.objects.filter(username=username).first()
    if user is None:
        users.objects.create_user(username=username, password=password)
    else:
        user.set_password(password)
        user.save()


class DjangoServer:
    """Django's threaded development WSGI server on ``host:port`` (0: a free port), on a thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        from django.core.servers.basehttp import (
            ThreadedWSGIServer,
            WSGIRequestHandler,
            get_internal_wsgi_application,
        )

        self.httpd: Any = ThreadedWSGIServer((host, port), WSGIRequestHandler)
        self.httpd.set_app(get_internal_wsgi_application())
        self.host = host
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="example-django-server",
            daemon=True,
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> DjangoServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
            self._thread.join(5)
        self.httpd.server_close()

    def __enter__(self) -> DjangoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
