// trainer.checkpoint_uri's parser: what it splits and what it refuses, with the reason.
#include "common/util/s3_uri.h"

#include <catch2/catch.hpp>

namespace rlhfd {

TEST_CASE("s3:// URIs split into bucket and prefix", "[s3]") {
  const S3Location location = ParseS3Uri("s3://my-bucket.ckpt/runs/gsm8k/").value();
  CHECK(location.bucket == "my-bucket.ckpt");
  CHECK(location.prefix == "runs/gsm8k");
  CHECK(S3Key(location, "latest") == "runs/gsm8k/latest");
  CHECK(S3Key(ParseS3Uri("s3://abc").value(), "latest") == "latest");
  CHECK(ParseS3Uri("s3://abc/").value().prefix.empty());
}

TEST_CASE("s3:// URIs S3 would refuse are refused with the reason", "[s3]") {
  for (const auto& [uri, reason] : std::vector<std::pair<std::string, std::string>>{
           {"/data/ckpt", "is not an s3:// URI"},
           {"gs://bucket/x", "is not an s3:// URI"},
           {"s3://", "not a valid S3 bucket name"},
           {"s3://ab/x", "not a valid S3 bucket name"},
           {"s3://My_Bucket/x", "not a valid S3 bucket name"},
           {"s3://-bucket/x", "not a valid S3 bucket name"},
           {"s3://bucket/a b", "holds ' '"},
           {"s3://bucket/a?b", "holds '?'"},
           {"s3://bucket//a", "empty, '.' or '..' path segment"},
           {"s3://bucket/a//b", "empty, '.' or '..' path segment"},
           {"s3://bucket/a/../b", "empty, '.' or '..' path segment"},
           {"s3://bucket/./b", "empty, '.' or '..' path segment"}}) {
    INFO(uri);
    const absl::StatusOr<S3Location> location = ParseS3Uri(uri);
    REQUIRE(absl::IsInvalidArgument(location.status()));
    CHECK_THAT(std::string(location.status().message()), Catch::Contains(reason));
  }
}

}  // namespace rlhfd
