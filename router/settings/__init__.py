"""The router's settings, in parts: ``backends``, ``routing``, ``health``, ``upstream``,
``http``, ``admission``, ``observability`` and ``online``, with the few of the whole router
(``workers``, ``admin_key``, the drain). Each is read by its flat spelling (the flag, the
``SPECROUTE_*`` variable, the file's key) or by its part's table in the file; the parts hold
values only, and the components they configure are built where the app is composed
(``router.components``)."""

from specroute.router.settings.router_settings import RouterSettings

__all__ = ["RouterSettings"]
