from rest_framework.views import APIView


class ThreadListView(APIView):
    pass


class ThreadDetailView(APIView):
    pass


class ThreadImportView(APIView):
    pass
