"""Modal's exception names that the provider relies on."""


class Error(Exception):
    pass


class NotFoundError(Error):
    pass


class AuthError(Error):
    pass


class ResourceExhaustedError(Error):
    pass
