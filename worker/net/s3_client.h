// A client of S3-compatible object storage (AWS S3, MinIO, Ceph, moto) over libcurl with
// Signature V4: what trainer.checkpoint_uri needs — objects put from memory or streamed from a
// file (multipart above a threshold, so a shard of any size fits S3's 5 GB request limit),
// objects read into memory or streamed to a file written crash-safely, listing and deletion.
// Transient failures (connection, 429, 5xx, stalls) are tried again with backoff. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/net/http_request.h"
#include "worker/net/sigv4.h"

namespace rlhfd::net {

struct S3Options {
  // "" for AWS (https://<bucket>.s3.<region>.amazonaws.com); else "http(s)://host[:port]" of an
  // S3-compatible server, addressed path-style (<endpoint>/<bucket>/<key>).
  std::string endpoint;
  std::string region = "us-east-1";
  AwsCredentials credentials;
  int64_t multipart_threshold = int64_t{64} << 20;  // files above it go in parts
  int64_t part_bytes = int64_t{64} << 20;           // S3: >= 5 MiB, <= 10,000 parts
  int attempts = 8;  // per request, transient failures: about 30 s of backoff in all
  absl::Duration first_backoff = absl::Milliseconds(250);
  absl::Duration max_backoff = absl::Seconds(10);
  absl::Duration stall_timeout = absl::Seconds(60);  // no byte moved for this long
  // Set: every request in flight stops (CANCELLED) and no new one starts (a job's attempt that
  // was replaced must not write over its successor's objects).
  std::shared_ptr<const std::atomic<bool>> cancelled;
};

// The options the AWS tools read from the environment: AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY (required: FAILED_PRECONDITION naming them), AWS_SESSION_TOKEN,
// AWS_REGION or AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL.
absl::StatusOr<S3Options> S3OptionsFromEnvironment();

class S3Client {
 public:
  S3Client(std::string bucket, S3Options options);

  absl::Status CreateBucket();
  absl::Status PutObject(const std::string& key, const std::string& contents);
  // Streams the file (one PUT up to options.multipart_threshold, else a multipart upload, which
  // is aborted on failure so no parts are left behind).
  absl::Status UploadFile(const std::string& key, const std::string& path);
  // NOT_FOUND when there is no such object. `max_bytes` bounds the error replies too (S3's are
  // XML of a few hundred bytes): give at least a few KiB.
  absl::StatusOr<std::string> GetObject(const std::string& key, size_t max_bytes = 16 << 20);
  // Writes the object to `path` through a temporary file, fsynced and renamed.
  absl::Status DownloadFile(const std::string& key, const std::string& path);
  // Every key starting with `prefix`, sorted.
  absl::StatusOr<std::vector<std::string>> ListKeys(const std::string& prefix);
  // The "directories" right under `prefix` (which ends with '/'): each distinct key prefix up
  // to the next '/', with it ("runs/step_3/"), sorted.
  absl::StatusOr<std::vector<std::string>> ListDirectories(const std::string& prefix);
  // Deleting a missing object is not an error (S3's own rule).
  absl::Status DeleteObject(const std::string& key);

  // "s3://bucket/key", for messages.
  std::string Describe(const std::string& key) const;

 private:
  struct Call {
    std::string method;
    std::string key;
    std::vector<std::pair<std::string, std::string>> query;
    std::string body;
    std::string upload_path;  // the body from this file range instead (unsigned payload)
    int64_t upload_offset = 0;
    int64_t upload_length = 0;
    int download_fd = -1;
    size_t max_reply_bytes = 1 << 20;
    bool despite_cancel = false;  // clean-up that must go out even for a cancelled attempt
  };
  // One request, tried again on transient failures while attempts remain.
  HttpReply Send(const Call& call) const;
  absl::Status UploadParts(const std::string& key, const std::string& path, int64_t size);
  // ListObjectsV2 over every page: the values of `tag` in each (nested in `within`, if given).
  absl::StatusOr<std::vector<std::string>> List(
      std::vector<std::pair<std::string, std::string>> query, const std::string& within,
      const std::string& tag);

  std::string bucket_;
  S3Options options_;
};

}  // namespace rlhfd::net
