// MPI profiling wrappers (the standard PMPI interface): each collective this
// process makes, from our code or from a library such as HDF5, goes into the
// flight recorder, then to the real PMPI_ function. Call sites stay plain MPI.
//
// 1. MPI_Init/MPI_Init_thread set MPI_ERRORS_RETURN on MPI_COMM_WORLD, and the
//    communicators made by split and dup get it too: a dead peer comes back
//    as an error code instead of Open MPI's generic abort.
// 2. A recorded call that returns an error ends the job with one line naming
//    the rank, the call and its sequence number, after dumping the recorder
//    (flight::fail). Calls on requests that are not ours (the MPI exchange's
//    point-to-point traffic, which handles its own errors) pass through.
// 3. A nonblocking collective stays in flight until a wait or test completes
//    its request: those are wrapped too (MPI_Wait*, MPI_Test*, and
//    MPI_Request_free, which gives it up).
//
// This object is pulled into every binary that links xx_resilience through
// MPI_Init/MPI_Init_thread, which every main calls.
#include <mpi.h>
#include <vector>
#include "resilience/flight_recorder.h"

namespace {

using xx::flight::recorder;

int64_t bytes_of(int count, MPI_Datatype type) {
  int size = 0;
  PMPI_Type_size(type, &size);
  return int64_t(count) * size;
}

// A blocking call: record it around the real one; an error ends the job.
template <class Call>
int recorded(const char* op, MPI_Comm comm, int64_t bytes, Call&& call) {
  const uint64_t id = recorder().begin(op, comm, bytes);
  const int rc = call();
  recorder().end(id, rc);
  if (rc != MPI_SUCCESS) xx::flight::fail(id, rc);
  return rc;
}

// A nonblocking call: in flight until its request completes.
template <class Call>
int started(const char* op, MPI_Comm comm, int64_t bytes, MPI_Request* request, Call&& call) {
  const uint64_t id = recorder().begin(op, comm, bytes);
  const int rc = call();
  if (rc != MPI_SUCCESS) recorder().end(id, rc), xx::flight::fail(id, rc);
  if (*request == MPI_REQUEST_NULL) recorder().end(id);  // done already: nothing to wait for
  else recorder().track(*request, id);
  return rc;
}

// The requests in `handles` (copies taken before the call: MPI resets them)
// that `done` says completed end their recorded calls.
template <class Done>
void completed(const std::vector<MPI_Request>& handles, int rc, Done&& done) {
  for (size_t i = 0; i < handles.size(); ++i) {
    if (handles[i] == MPI_REQUEST_NULL || !done(i)) continue;
    const uint64_t id = recorder().untrack(handles[i]);
    if (id == 0) continue;
    recorder().end(id, rc);
    if (rc != MPI_SUCCESS) xx::flight::fail(id, rc);
  }
}

// MPI_Testsome, MPI_Waitsome: the requests at indices[0, outcount) completed
// (all of them end on an error).
void completed_some(const std::vector<MPI_Request>& handles, int rc, int outcount, const int* indices) {
  std::vector<bool> done(handles.size(), rc != MPI_SUCCESS);
  if (rc == MPI_SUCCESS && outcount != MPI_UNDEFINED)
    for (int i = 0; i < outcount; ++i) done[indices[i]] = true;
  completed(handles, rc, [&](size_t i) { return bool(done[i]); });
}

void errors_return(MPI_Comm comm) {
  if (comm != MPI_COMM_NULL) PMPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
}

void on_init() {
  errors_return(MPI_COMM_WORLD);
  int rank = 0, world = 1;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(MPI_COMM_WORLD, &world);
  xx::flight::set_identity(rank, world);
}

}  // namespace

// ---------------------------------------------------------------------------
// start-up

int MPI_Init(int* argc, char*** argv) {
  const int rc = PMPI_Init(argc, argv);
  if (rc == MPI_SUCCESS) on_init();
  return rc;
}

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  const int rc = PMPI_Init_thread(argc, argv, required, provided);
  if (rc == MPI_SUCCESS) on_init();
  return rc;
}

// ---------------------------------------------------------------------------
// collectives

int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  return recorded("MPI_Allreduce", comm, bytes_of(count, type),
                  [&] { return PMPI_Allreduce(send, recv, count, type, op, comm); });
}

int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
  return started("MPI_Iallreduce", comm, bytes_of(count, type), request,
                 [&] { return PMPI_Iallreduce(send, recv, count, type, op, comm, request); });
}

int MPI_Reduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, int root, MPI_Comm comm) {
  return recorded("MPI_Reduce", comm, bytes_of(count, type),
                  [&] { return PMPI_Reduce(send, recv, count, type, op, root, comm); });
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  return recorded("MPI_Bcast", comm, bytes_of(count, type), [&] { return PMPI_Bcast(buffer, count, type, root, comm); });
}

int MPI_Barrier(MPI_Comm comm) {
  return recorded("MPI_Barrier", comm, 0, [&] { return PMPI_Barrier(comm); });
}

int MPI_Allgather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                  MPI_Datatype recv_type, MPI_Comm comm) {
  const int64_t bytes = send == MPI_IN_PLACE ? bytes_of(recv_count, recv_type) : bytes_of(send_count, send_type);
  return recorded("MPI_Allgather", comm, bytes, [&] {
    return PMPI_Allgather(send, send_count, send_type, recv, recv_count, recv_type, comm);
  });
}

int MPI_Allgatherv(const void* send, int send_count, MPI_Datatype send_type, void* recv, const int recv_counts[],
                   const int displs[], MPI_Datatype recv_type, MPI_Comm comm) {
  return recorded("MPI_Allgatherv", comm, send == MPI_IN_PLACE ? 0 : bytes_of(send_count, send_type), [&] {
    return PMPI_Allgatherv(send, send_count, send_type, recv, recv_counts, displs, recv_type, comm);
  });
}

int MPI_Gather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
               MPI_Datatype recv_type, int root, MPI_Comm comm) {
  return recorded("MPI_Gather", comm, send == MPI_IN_PLACE ? 0 : bytes_of(send_count, send_type), [&] {
    return PMPI_Gather(send, send_count, send_type, recv, recv_count, recv_type, root, comm);
  });
}

int MPI_Gatherv(const void* send, int send_count, MPI_Datatype send_type, void* recv, const int recv_counts[],
                const int displs[], MPI_Datatype recv_type, int root, MPI_Comm comm) {
  return recorded("MPI_Gatherv", comm, send == MPI_IN_PLACE ? 0 : bytes_of(send_count, send_type), [&] {
    return PMPI_Gatherv(send, send_count, send_type, recv, recv_counts, displs, recv_type, root, comm);
  });
}

int MPI_Alltoall(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                 MPI_Datatype recv_type, MPI_Comm comm) {
  int size = 1;
  PMPI_Comm_size(comm, &size);
  return recorded("MPI_Alltoall", comm, bytes_of(send_count, send_type) * size, [&] {
    return PMPI_Alltoall(send, send_count, send_type, recv, recv_count, recv_type, comm);
  });
}

int MPI_Alltoallv(const void* send, const int send_counts[], const int send_displs[], MPI_Datatype send_type,
                  void* recv, const int recv_counts[], const int recv_displs[], MPI_Datatype recv_type,
                  MPI_Comm comm) {
  int size = 1;
  PMPI_Comm_size(comm, &size);
  int64_t count = 0;
  if (send != MPI_IN_PLACE)
    for (int i = 0; i < size; ++i) count += send_counts[i];
  return recorded("MPI_Alltoallv", comm, bytes_of(1, send_type) * count, [&] {
    return PMPI_Alltoallv(send, send_counts, send_displs, send_type, recv, recv_counts, recv_displs, recv_type, comm);
  });
}

// Point to point, but blocking and made by every rank of the ring topology at
// the same moment: a hung neighbour shows here.
int MPI_Sendrecv(const void* send, int send_count, MPI_Datatype send_type, int dest, int send_tag, void* recv,
                 int recv_count, MPI_Datatype recv_type, int source, int recv_tag, MPI_Comm comm,
                 MPI_Status* status) {
  return recorded("MPI_Sendrecv", comm, bytes_of(send_count, send_type), [&] {
    return PMPI_Sendrecv(send, send_count, send_type, dest, send_tag, recv, recv_count, recv_type, source,
                         recv_tag, comm, status);
  });
}

// ---------------------------------------------------------------------------
// communicators and windows (collective too)

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* out) {
  const int rc = recorded("MPI_Comm_split", comm, 0, [&] { return PMPI_Comm_split(comm, color, key, out); });
  errors_return(*out);
  return rc;
}

int MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm* out) {
  const int rc =
      recorded("MPI_Comm_split_type", comm, 0, [&] { return PMPI_Comm_split_type(comm, type, key, info, out); });
  errors_return(*out);
  return rc;
}

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* out) {
  const int rc = recorded("MPI_Comm_dup", comm, 0, [&] { return PMPI_Comm_dup(comm, out); });
  errors_return(*out);
  return rc;
}

int MPI_Comm_free(MPI_Comm* comm) {
  recorder().forget(*comm);
  return PMPI_Comm_free(comm);
}

int MPI_Win_allocate_shared(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, void* base, MPI_Win* win) {
  return recorded("MPI_Win_allocate_shared", comm, 0,
                  [&] { return PMPI_Win_allocate_shared(size, disp_unit, info, comm, base, win); });
}

// ---------------------------------------------------------------------------
// completion of nonblocking collectives

int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  if (!recorder().tracking()) return PMPI_Wait(request, status);
  const std::vector<MPI_Request> handles = {*request};
  const int rc = PMPI_Wait(request, status);
  completed(handles, rc, [](size_t) { return true; });
  return rc;
}

int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
  if (!recorder().tracking()) return PMPI_Waitall(count, requests, statuses);
  const std::vector<MPI_Request> handles(requests, requests + count);
  const int rc = PMPI_Waitall(count, requests, statuses);
  completed(handles, rc, [](size_t) { return true; });
  return rc;
}

int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  if (!recorder().tracking()) return PMPI_Test(request, flag, status);
  const std::vector<MPI_Request> handles = {*request};
  const int rc = PMPI_Test(request, flag, status);
  completed(handles, rc, [&](size_t) { return rc != MPI_SUCCESS || *flag; });
  return rc;
}

int MPI_Testall(int count, MPI_Request requests[], int* flag, MPI_Status statuses[]) {
  if (!recorder().tracking()) return PMPI_Testall(count, requests, flag, statuses);
  const std::vector<MPI_Request> handles(requests, requests + count);
  const int rc = PMPI_Testall(count, requests, flag, statuses);
  completed(handles, rc, [&](size_t) { return rc != MPI_SUCCESS || *flag; });
  return rc;
}

int MPI_Testsome(int count, MPI_Request requests[], int* outcount, int indices[], MPI_Status statuses[]) {
  if (!recorder().tracking()) return PMPI_Testsome(count, requests, outcount, indices, statuses);
  const std::vector<MPI_Request> handles(requests, requests + count);
  const int rc = PMPI_Testsome(count, requests, outcount, indices, statuses);
  completed_some(handles, rc, *outcount, indices);
  return rc;
}

// Not used by our code today; wrapped so that a request completed through
// them cannot stay "in flight" and trip the watchdog.
int MPI_Waitany(int count, MPI_Request requests[], int* index, MPI_Status* status) {
  if (!recorder().tracking()) return PMPI_Waitany(count, requests, index, status);
  const std::vector<MPI_Request> handles(requests, requests + count);
  const int rc = PMPI_Waitany(count, requests, index, status);
  completed(handles, rc, [&](size_t i) { return rc != MPI_SUCCESS || int(i) == *index; });
  return rc;
}

int MPI_Testany(int count, MPI_Request requests[], int* index, int* flag, MPI_Status* status) {
  if (!recorder().tracking()) return PMPI_Testany(count, requests, index, flag, status);
  const std::vector<MPI_Request> handles(requests, requests + count);
  const int rc = PMPI_Testany(count, requests, index, flag, status);
  completed(handles, rc, [&](size_t i) { return rc != MPI_SUCCESS || (*flag && int(i) == *index); });
  return rc;
}

int MPI_Waitsome(int count, MPI_Request requests[], int* outcount, int indices[], MPI_Status statuses[]) {
  if (!recorder().tracking()) return PMPI_Waitsome(count, requests, outcount, indices, statuses);
  const std::vector<MPI_Request> handles(requests, requests + count);
  const int rc = PMPI_Waitsome(count, requests, outcount, indices, statuses);
  completed_some(handles, rc, *outcount, indices);
  return rc;
}

int MPI_Request_free(MPI_Request* request) {
  if (recorder().tracking() && *request != MPI_REQUEST_NULL) {
    const uint64_t id = recorder().untrack(*request);
    if (id) recorder().end(id);  // given up on: no longer in flight as far as we can tell
  }
  return PMPI_Request_free(request);
}
