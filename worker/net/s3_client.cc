#include "worker/net/s3_client.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/util/files.h"

namespace rlhfd::net {
namespace {

std::string Environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// The text of every <tag>...</tag> in an S3 XML reply, entities decoded.
std::vector<std::string> XmlValues(absl::string_view xml, absl::string_view tag) {
  const std::string open = absl::StrCat("<", tag, ">");
  const std::string close = absl::StrCat("</", tag, ">");
  std::vector<std::string> values;
  for (size_t at = xml.find(open); at != absl::string_view::npos; at = xml.find(open, at)) {
    const size_t begin = at + open.size();
    const size_t end = xml.find(close, begin);
    if (end == absl::string_view::npos) break;
    values.push_back(absl::StrReplaceAll(
        xml.substr(begin, end - begin),
        {{"&quot;", "\""}, {"&apos;", "'"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&amp;", "&"}}));
    at = end + close.size();
  }
  return values;
}

}  // namespace

absl::StatusOr<S3Options> S3OptionsFromEnvironment() {
  S3Options options;
  options.credentials = {.access_key_id = Environment("AWS_ACCESS_KEY_ID"),
                         .secret_access_key = Environment("AWS_SECRET_ACCESS_KEY"),
                         .session_token = Environment("AWS_SESSION_TOKEN")};
  if (options.credentials.access_key_id.empty() || options.credentials.secret_access_key.empty()) {
    return absl::FailedPreconditionError(
        "trainer.checkpoint_uri: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
        "workers' environment (the S3 credentials)");
  }
  for (const char* name : {"AWS_REGION", "AWS_DEFAULT_REGION"}) {
    if (const std::string region = Environment(name); !region.empty()) {
      options.region = region;
      break;
    }
  }
  for (const char* name : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
    if (std::string endpoint = Environment(name); !endpoint.empty()) {
      const size_t host = endpoint.find("://");
      const size_t path = host == std::string::npos ? host : endpoint.find('/', host + 3);
      if ((!absl::StartsWith(endpoint, "http://") && !absl::StartsWith(endpoint, "https://")) ||
          (path != std::string::npos && path + 1 != endpoint.size())) {
        return absl::FailedPreconditionError(absl::StrCat(
            name, "='", endpoint, "': give the server's URL, http(s)://host[:port], no path"));
      }
      options.endpoint = std::move(endpoint);
      break;
    }
  }
  return options;
}

S3Client::S3Client(std::string bucket, S3Options options)
    : bucket_(std::move(bucket)), options_(std::move(options)) {
  while (!options_.endpoint.empty() && options_.endpoint.back() == '/') {
    options_.endpoint.pop_back();
  }
}

std::string S3Client::Describe(const std::string& key) const {
  return absl::StrCat("s3://", bucket_, "/", key);
}

HttpReply S3Client::Send(const Call& call) const {
  std::string scheme = "https";
  std::string host = absl::StrCat(bucket_, ".s3.", options_.region, ".amazonaws.com");
  std::string path = absl::StrCat("/", UriEncode(call.key, /*encode_slash=*/false));
  if (!options_.endpoint.empty()) {
    absl::string_view rest = options_.endpoint;
    const size_t scheme_end = rest.find("://");
    scheme = std::string(rest.substr(0, scheme_end));
    rest.remove_prefix(scheme_end + 3);
    host = std::string(rest.substr(0, rest.find('/')));
    // curl sends a default port in no Host header; the signature must name the host the same.
    if (absl::EndsWith(host, scheme == "https" ? ":443" : ":80")) host.resize(host.rfind(':'));
    path = absl::StrCat("/", bucket_, call.key.empty() ? "" : path);
  }
  const std::string query = CanonicalQuery(call.query);
  const std::string url = absl::StrCat(scheme, "://", host, path, query.empty() ? "" : "?", query);
  const std::string where = absl::StrCat(call.method, " ", Describe(call.key));
  const bool from_file = !call.upload_path.empty();
  const std::string payload_sha256 = from_file ? "UNSIGNED-PAYLOAD" : Sha256Hex(call.body);
  HttpReply reply;
  absl::Duration backoff = options_.first_backoff;
  for (int attempt = 1;; ++attempt) {
    if (!call.despite_cancel && options_.cancelled && options_.cancelled->load()) {
      reply = {absl::CancelledError(absl::StrCat(where, ": cancelled"))};
      return reply;
    }
    if (call.download_fd >= 0 &&
        (::ftruncate(call.download_fd, 0) != 0 || ::lseek(call.download_fd, 0, SEEK_SET) != 0)) {
      reply = {absl::InternalError(
          absl::StrCat(where, ": cannot rewind the file being written: ", std::strerror(errno)))};
      return reply;
    }
    HttpRequest request{.method = call.method,
                        .url = url,
                        .body = call.body,
                        .upload_path = call.upload_path,
                        .upload_offset = call.upload_offset,
                        .upload_length = call.upload_length,
                        .download_fd = call.download_fd,
                        .timeout = absl::ZeroDuration(),
                        .stall_timeout = options_.stall_timeout,
                        .max_reply_bytes = call.max_reply_bytes,
                        .cancelled = call.despite_cancel ? nullptr : options_.cancelled.get()};
    request.headers = SignRequest({.method = call.method,
                                   .host = host,
                                   .path = path,
                                   .query = call.query,
                                   .payload_sha256 = payload_sha256,
                                   .region = options_.region,
                                   .amz_date = AmzDate(absl::Now())},
                                  options_.credentials);
    // A body of its own type: curl's default for a body (form data) makes some servers parse it.
    if (call.method == "PUT" || call.method == "POST") {
      request.headers.emplace_back("Content-Type", "application/octet-stream");
    }
    reply = Perform(request, where);
    // S3's own codes where the HTTP status says too little: a missing bucket is no missing
    // object (a resume must not start afresh over it), and a request the server timed out
    // waiting for is worth sending again.
    if (reply.http_status == 404 && absl::StrContains(reply.body, "<Code>NoSuchBucket</Code>")) {
      reply.status = absl::FailedPreconditionError(absl::StrCat(
          where, ": the bucket ", bucket_, " does not exist (or the endpoint is another server)"));
    }
    if (reply.http_status == 400 && absl::StrContains(reply.body, "<Code>RequestTimeout</Code>")) {
      reply.retryable = true;
    }
    if (reply.status.ok() || !reply.retryable || attempt >= options_.attempts) return reply;
    // Jittered, so that a thousand ranks told to slow down do not come back together.
    thread_local absl::BitGen jitter;
    absl::SleepFor(backoff * absl::Uniform(jitter, 0.5, 1.5));
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status S3Client::CreateBucket() {
  Call call{.method = "PUT"};
  if (options_.region != "us-east-1") {
    call.body = absl::StrCat(
        "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        "<LocationConstraint>",
        options_.region, "</LocationConstraint></CreateBucketConfiguration>");
  }
  return Send(call).status;
}

absl::Status S3Client::PutObject(const std::string& key, const std::string& contents) {
  return Send({.method = "PUT", .key = key, .body = contents}).status;
}

absl::Status S3Client::UploadFile(const std::string& key, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("upload to ", Describe(key), ": cannot stat ", path,
                                            ": ", std::strerror(errno)));
  }
  const int64_t size = st.st_size;
  if (size > options_.multipart_threshold) return UploadParts(key, path, size);
  return Send({.method = "PUT",
               .key = key,
               .upload_path = path,
               .upload_offset = 0,
               .upload_length = size})
      .status;
}

absl::Status S3Client::UploadParts(const std::string& key, const std::string& path, int64_t size) {
  const HttpReply created = Send({.method = "POST", .key = key, .query = {{"uploads", ""}}});
  if (!created.status.ok()) return created.status;
  const std::vector<std::string> ids = XmlValues(created.body, "UploadId");
  if (ids.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("multipart upload to ", Describe(key),
                                                      ": the server's reply names no UploadId"));
  }
  const std::string& upload_id = ids.front();
  // S3 takes at most 10,000 parts.
  const int64_t part_bytes = std::max(options_.part_bytes, (size + 9999) / 10000);
  std::string completion = "<CompleteMultipartUpload>";
  absl::Status status;
  for (int64_t offset = 0, number = 1; offset < size && status.ok();
       offset += part_bytes, ++number) {
    const HttpReply part =
        Send({.method = "PUT",
              .key = key,
              .query = {{"partNumber", absl::StrCat(number)}, {"uploadId", upload_id}},
              .upload_path = path,
              .upload_offset = offset,
              .upload_length = std::min(part_bytes, size - offset)});
    status = part.status;
    const std::string etag = ReplyHeader(part, "etag");
    if (status.ok() && etag.empty()) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "multipart upload to ", Describe(key), ": part ", number, "'s reply has no ETag"));
    }
    absl::StrAppend(&completion, "<Part><PartNumber>", number, "</PartNumber><ETag>", etag,
                    "</ETag></Part>");
  }
  if (status.ok()) {
    absl::StrAppend(&completion, "</CompleteMultipartUpload>");
    const HttpReply completed = Send(
        {.method = "POST", .key = key, .query = {{"uploadId", upload_id}}, .body = completion});
    status = completed.status;
    // S3 may answer 200 and report the failure in the body.
    if (status.ok() && absl::StrContains(completed.body, "<Error>")) {
      status = absl::UnavailableError(
          absl::StrCat("completing the multipart upload to ", Describe(key), ": ", completed.body));
    }
  }
  if (!status.ok()) {
    // No parts left billed and invisible (sent even when the job's attempt was cancelled); the
    // upload's failure is what is reported.
    Send({.method = "DELETE",
          .key = key,
          .query = {{"uploadId", upload_id}},
          .despite_cancel = true});
  }
  return status;
}

absl::StatusOr<std::string> S3Client::GetObject(const std::string& key, size_t max_bytes) {
  HttpReply reply = Send({.method = "GET", .key = key, .max_reply_bytes = max_bytes});
  if (!reply.status.ok()) return reply.status;
  return std::move(reply.body);
}

absl::Status S3Client::DownloadFile(const std::string& key, const std::string& path) {
  return WriteFileAtomicallyWith(
      path, [&](int fd) { return Send({.method = "GET", .key = key, .download_fd = fd}).status; });
}

absl::StatusOr<std::vector<std::string>> S3Client::List(
    std::vector<std::pair<std::string, std::string>> query, const std::string& within,
    const std::string& tag) {
  query.emplace_back("list-type", "2");
  std::vector<std::string> values;
  std::string token;
  while (true) {
    Call call{.method = "GET", .query = query, .max_reply_bytes = 16 << 20};
    if (!token.empty()) call.query.emplace_back("continuation-token", token);
    const HttpReply reply = Send(call);
    if (!reply.status.ok()) return reply.status;
    for (const std::string& block :
         within.empty() ? std::vector<std::string>{reply.body} : XmlValues(reply.body, within)) {
      for (std::string& value : XmlValues(block, tag)) values.push_back(std::move(value));
    }
    const std::vector<std::string> next = XmlValues(reply.body, "NextContinuationToken");
    const std::vector<std::string> truncated = XmlValues(reply.body, "IsTruncated");
    if (truncated.empty() || truncated.front() != "true") break;
    if (next.empty()) {
      return absl::DataLossError(absl::StrCat("listing ", Describe(""),
                                              ": the reply is truncated and names no next page"));
    }
    token = next.front();
  }
  std::sort(values.begin(), values.end());
  return values;
}

absl::StatusOr<std::vector<std::string>> S3Client::ListKeys(const std::string& prefix) {
  return List({{"prefix", prefix}}, "Contents", "Key");
}

absl::StatusOr<std::vector<std::string>> S3Client::ListDirectories(const std::string& prefix) {
  return List({{"prefix", prefix}, {"delimiter", "/"}}, "CommonPrefixes", "Prefix");
}

absl::Status S3Client::DeleteObject(const std::string& key) {
  const absl::Status status = Send({.method = "DELETE", .key = key}).status;
  return absl::IsNotFound(status) ? absl::OkStatus() : status;
}

}  // namespace rlhfd::net
