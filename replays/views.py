from django.http import HttpRequest, HttpResponse


def thread_list(request: HttpRequest) -> HttpResponse:
    raise NotImplementedError


def thread_detail(request: HttpRequest, pk: int) -> HttpResponse:
    raise NotImplementedError


def thread_upload(request: HttpRequest) -> HttpResponse:
    raise NotImplementedError
