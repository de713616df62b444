#include "worker/net/http_request.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/util/text.h"

namespace rlhfd::net {
namespace {

void InitializeCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};
struct HeaderListDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

// Where the reply goes: memory up to a cap, or a file descriptor.
struct ReplySink {
  std::string body;
  size_t limit = 0;
  int fd = -1;
  bool truncated = false;
  int write_errno = 0;
  std::vector<std::pair<std::string, std::string>> headers;
};

size_t AppendReply(char* data, size_t size, size_t count, void* user) {
  auto* reply = static_cast<ReplySink*>(user);
  const size_t bytes = size * count;
  if (reply->fd >= 0) {
    for (size_t done = 0; done < bytes;) {
      const ssize_t wrote = ::write(reply->fd, data + done, bytes - done);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) {
        reply->write_errno = wrote < 0 ? errno : EIO;
        return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
      }
      done += static_cast<size_t>(wrote);
    }
    return bytes;
  }
  if (reply->body.size() + bytes > reply->limit) {
    reply->truncated = true;
    return 0;
  }
  reply->body.append(data, bytes);
  return bytes;
}

size_t AppendHeader(char* data, size_t size, size_t count, void* user) {
  auto* reply = static_cast<ReplySink*>(user);
  const absl::string_view line(data, size * count);
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    reply->headers.emplace_back(absl::AsciiStrToLower(line.substr(0, colon)),
                                std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  }
  return size * count;
}

// The upload's source: a range of an open file.
struct UploadSource {
  int fd = -1;
  int64_t offset = 0;
  int64_t remaining = 0;
  int read_errno = 0;
};

size_t ReadUpload(char* buffer, size_t size, size_t count, void* user) {
  auto* source = static_cast<UploadSource*>(user);
  const size_t want = std::min<int64_t>(static_cast<int64_t>(size * count), source->remaining);
  if (want == 0) return 0;
  ssize_t got;
  do {
    got = ::pread(source->fd, buffer, want, source->offset);
  } while (got < 0 && errno == EINTR);
  if (got <= 0) {
    source->read_errno = got < 0 ? errno : EIO;
    return CURL_READFUNC_ABORT;
  }
  source->offset += got;
  source->remaining -= got;
  return static_cast<size_t>(got);
}

int CheckCancelled(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* cancelled = static_cast<const std::atomic<bool>*>(user);
  return cancelled != nullptr && cancelled->load() ? 1 : 0;
}

struct FileCloser {
  void operator()(const int* fd) const {
    if (*fd >= 0) ::close(*fd);
  }
};

}  // namespace

HttpReply Perform(const HttpRequest& request, absl::string_view where) {
  InitializeCurlOnce();
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) return {absl::InternalError(absl::StrCat(where, ": curl_easy_init failed"))};
  curl_slist* header_list = nullptr;
  for (const auto& [name, value] : request.headers) {
    header_list = curl_slist_append(header_list, absl::StrCat(name, ": ", value).c_str());
  }
  // No "Expect: 100-continue" round trip before a body.
  header_list = curl_slist_append(header_list, "Expect:");
  std::unique_ptr<curl_slist, HeaderListDeleter> headers(header_list);
  ReplySink reply{.limit = request.max_reply_bytes, .fd = request.download_fd};
  UploadSource upload;
  int upload_fd = -1;
  std::unique_ptr<const int, FileCloser> close_upload(&upload_fd);
  char error_text[CURL_ERROR_SIZE] = {0};
  CURL* handle = curl.get();
  curl_easy_setopt(handle, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers.get());
  if (!request.upload_path.empty()) {
    upload_fd = ::open(request.upload_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (upload_fd < 0) {
      return {absl::NotFoundError(
          absl::StrCat(where, ": cannot open ", request.upload_path, ": ", std::strerror(errno)))};
    }
    upload = {.fd = upload_fd, .offset = request.upload_offset, .remaining = request.upload_length};
    curl_easy_setopt(handle, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(handle, CURLOPT_READFUNCTION, ReadUpload);
    curl_easy_setopt(handle, CURLOPT_READDATA, &upload);
    curl_easy_setopt(handle, CURLOPT_INFILESIZE_LARGE,
                     static_cast<curl_off_t>(request.upload_length));
    curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  } else if (request.method == "GET") {
    curl_easy_setopt(handle, CURLOPT_HTTPGET, 1L);
  } else if (request.method == "HEAD") {
    curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
  } else {
    curl_easy_setopt(handle, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
    curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  if (request.timeout > absl::ZeroDuration()) {
    curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(request.timeout)));
  }
  if (request.stall_timeout > absl::ZeroDuration()) {
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME,
                     static_cast<long>(absl::ToInt64Seconds(request.stall_timeout)));
  }
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS timeouts
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, AppendReply);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, AppendHeader);
  curl_easy_setopt(handle, CURLOPT_HEADERDATA, &reply);
  curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error_text);
  curl_easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, CheckCancelled);
  curl_easy_setopt(handle, CURLOPT_XFERINFODATA, request.cancelled);
  curl_easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
  const CURLcode code = curl_easy_perform(handle);
  HttpReply result;
  result.headers = std::move(reply.headers);
  if (upload.read_errno != 0) {  // the read callback's abort, not a cancellation
    result.status = absl::DataLossError(absl::StrCat(
        where, ": reading ", request.upload_path, " failed: ", std::strerror(upload.read_errno)));
    return result;
  }
  if (code == CURLE_ABORTED_BY_CALLBACK) {
    result.status = absl::CancelledError(absl::StrCat(where, ": cancelled"));
    return result;
  }
  if (code == CURLE_WRITE_ERROR && reply.truncated) {
    result.status = absl::InvalidArgumentError(
        absl::StrCat(where, ": the reply is longer than ", request.max_reply_bytes, " bytes"));
    return result;
  }
  if (code == CURLE_WRITE_ERROR && reply.write_errno != 0) {
    result.status = absl::ResourceExhaustedError(absl::StrCat(
        where, ": writing the reply to disk failed: ", std::strerror(reply.write_errno)));
    return result;
  }
  if (code == CURLE_OPERATION_TIMEDOUT) {
    result.status = absl::DeadlineExceededError(absl::StrCat(
        where, ": no complete answer within ",
        absl::FormatDuration(request.timeout > absl::ZeroDuration() ? request.timeout
                                                                    : request.stall_timeout),
        request.timeout > absl::ZeroDuration() ? "" : " of no progress",
        request.timeout_key.empty() ? "" : absl::StrCat(" (", request.timeout_key, ")")));
    result.retryable = true;
    return result;
  }
  if (code != CURLE_OK) {
    result.status = absl::UnavailableError(
        absl::StrCat(where, ": ", error_text[0] != '\0' ? error_text : curl_easy_strerror(code)));
    result.retryable = true;
    return result;
  }
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &result.http_status);
  result.body = std::move(reply.body);
  const long http = result.http_status;
  if (http < 200 || http >= 300) {
    result.retryable = http == 429 || http >= 500;
    const std::string text =
        absl::StrCat(where, ": HTTP ", http, ": ", SanitizeForDisplay(result.body, 300));
    result.status = result.retryable ? absl::UnavailableError(text)
                    : http == 404    ? absl::NotFoundError(text)
                                     : absl::FailedPreconditionError(text);
  }
  return result;
}

std::string ReplyHeader(const HttpReply& reply, absl::string_view name) {
  for (const auto& [key, value] : reply.headers) {
    if (key == name) return value;
  }
  return "";
}

}  // namespace rlhfd::net
