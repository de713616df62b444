// Signature V4 against AWS's published examples, and the S3 client against a real S3-compatible
// server process (moto): objects in memory and files (single and multipart), listing, deletion,
// and each failure named with the object it was about.
#include "worker/net/s3_client.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/util/files.h"
#include "tests/support/s3_test_server.h"
#include "tests/support/subprocess.h"
#include "worker/net/sigv4.h"

namespace rlhfd::net {
namespace {

using rlhfd::testing::S3TestServer;
using rlhfd::testing::TempDir;

std::string Header(const std::vector<std::pair<std::string, std::string>>& headers,
                   const std::string& name) {
  for (const auto& [key, value] : headers) {
    if (key == name) return value;
  }
  return "";
}

// A bytes pattern no two offsets of which repeat within a part, so a part sent twice or out of
// order changes the object.
std::string Pattern(size_t bytes) {
  std::string data(bytes, '\0');
  uint64_t state = 88172645463325252ull;
  for (char& c : data) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    c = static_cast<char>(state);
  }
  return data;
}

S3Options TestOptions(const std::string& endpoint) {
  S3Options options;
  options.endpoint = endpoint;
  options.credentials = {.access_key_id = "rlhfd-test", .secret_access_key = "rlhfd-test-secret"};
  options.first_backoff = absl::Milliseconds(10);
  return options;
}

}  // namespace

TEST_CASE("SigV4 gives the signature of AWS's GET Object example", "[s3]") {
  // docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html, "Example: GET Object".
  const auto headers =
      SignRequest({.method = "GET",
                   .host = "examplebucket.s3.amazonaws.com",
                   .path = "/test.txt",
                   .headers = {{"Range", "bytes=0-9"}},
                   .payload_sha256 = Sha256Hex(""),
                   .region = "us-east-1",
                   .amz_date = "20130524T000000Z"},
                  {.access_key_id = "AKIAIOSFODNN7EXAMPLE",
                   .secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"});
  CHECK(Header(headers, "Authorization") ==
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  CHECK(Header(headers, "x-amz-content-sha256") ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("SigV4 sorts the query as AWS's test suite's get-vanilla-query-order-key-case", "[s3]") {
  const auto headers =
      SignRequest({.method = "GET",
                   .host = "example.amazonaws.com",
                   .path = "/",
                   .query = {{"Param2", "value2"}, {"Param1", "value1"}},
                   .payload_sha256 = Sha256Hex(""),
                   .content_sha256_header = false,
                   .region = "us-east-1",
                   .service = "service",
                   .amz_date = "20150830T123600Z"},
                  {.access_key_id = "AKIDEXAMPLE",
                   .secret_access_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"});
  CHECK(Header(headers, "Authorization") ==
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request,"
        "SignedHeaders=host;x-amz-date,"
        "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}

TEST_CASE("URI encoding keeps what SigV4 keeps", "[s3]") {
  CHECK(UriEncode("step_3/actor/rank_0/state.safetensors", false) ==
        "step_3/actor/rank_0/state.safetensors");
  CHECK(UriEncode("a b/c~d*'()", false) == "a%20b/c~d%2A%27%28%29");
  CHECK(UriEncode("a/b", true) == "a%2Fb");
  CHECK(CanonicalQuery({{"uploadId", "x/y z"}, {"partNumber", "2"}}) ==
        "partNumber=2&uploadId=x%2Fy%20z");
}

TEST_CASE("S3 options come from the AWS environment variables", "[s3]") {
  ::unsetenv("AWS_ACCESS_KEY_ID");
  const absl::StatusOr<S3Options> missing = S3OptionsFromEnvironment();
  REQUIRE(absl::IsFailedPrecondition(missing.status()));
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("AWS_ACCESS_KEY_ID"));
  rlhfd::testing::SetS3Environment("http://127.0.0.1:9/");
  ::setenv("AWS_REGION", "eu-west-3", 1);
  const absl::StatusOr<S3Options> options = S3OptionsFromEnvironment();
  REQUIRE(options.ok());
  CHECK(options->region == "eu-west-3");
  CHECK(options->endpoint == "http://127.0.0.1:9/");
  ::setenv("AWS_ENDPOINT_URL", "127.0.0.1:9", 1);
  CHECK_THAT(std::string(S3OptionsFromEnvironment().status().message()),
             Catch::Contains("AWS_ENDPOINT_URL='127.0.0.1:9'"));
  ::setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9/s3", 1);
  CHECK_THAT(std::string(S3OptionsFromEnvironment().status().message()),
             Catch::Contains("no path"));
  for (const char* name :
       {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL"}) {
    ::unsetenv(name);
  }
}

TEST_CASE("the S3 client against an S3-compatible server", "[s3]") {
  TempDir dir;
  S3TestServer server(dir.path());
  REQUIRE(server.ok());
  S3Options options = TestOptions(server.endpoint());
  options.multipart_threshold = 6 << 20;
  options.part_bytes = 5 << 20;  // S3's smallest part but the last
  S3Client client("rlhfd-ckpt", options);
  REQUIRE(client.CreateBucket().ok());

  SECTION("objects in memory, listing and deletion") {
    REQUIRE(client.PutObject("run/step_1/commit.json", "{\"step\": 1}").ok());
    REQUIRE(client.PutObject("run/latest", "step_1").ok());
    REQUIRE(client.PutObject("other/latest", "step_9").ok());
    CHECK(client.GetObject("run/latest").value() == "step_1");
    const absl::StatusOr<std::string> missing = client.GetObject("run/step_2/commit.json");
    CHECK(absl::IsNotFound(missing.status()));
    CHECK_THAT(std::string(missing.status().message()),
               Catch::Contains("s3://rlhfd-ckpt/run/step_2/commit.json"));
    CHECK(client.ListKeys("run/").value() ==
          std::vector<std::string>{"run/latest", "run/step_1/commit.json"});
    CHECK(client.ListDirectories("").value() == std::vector<std::string>{"other/", "run/"});
    CHECK(client.ListDirectories("run/").value() == std::vector<std::string>{"run/step_1/"});
    REQUIRE(client.DeleteObject("run/latest").ok());
    CHECK(client.DeleteObject("run/latest").ok());  // already gone
    CHECK(absl::IsNotFound(client.GetObject("run/latest").status()));
  }

  SECTION("files, in one request and in parts, come back byte for byte") {
    for (const size_t bytes : {size_t{3000}, size_t{12} << 20}) {  // 12 MiB: parts of 5, 5, 2
      const std::string data = Pattern(bytes);
      const std::string source = dir.path() + "/source";
      REQUIRE(WriteFileAtomically(source, data).ok());
      const std::string key = absl::StrCat("files/", bytes);
      const absl::Status uploaded = client.UploadFile(key, source);
      INFO(uploaded);
      REQUIRE(uploaded.ok());
      const std::string copy = dir.path() + "/copy";
      const absl::Status downloaded = client.DownloadFile(key, copy);
      INFO(downloaded);
      REQUIRE(downloaded.ok());
      CHECK(ReadFileToString(copy).value() == data);
    }
    // An object's failed download leaves nothing behind: no file, no temporary.
    const std::string absent = dir.path() + "/absent";
    CHECK(absl::IsNotFound(client.DownloadFile("files/none", absent)));
    CHECK(!PathExists(absent));
    CHECK(ListDirectory(dir.path()).value() ==
          std::vector<std::string>{"copy", "moto.log", "source"});
    const absl::Status no_source = client.UploadFile("files/x", dir.path() + "/no-such-file");
    CHECK(absl::IsNotFound(no_source));
    CHECK_THAT(std::string(no_source.message()), Catch::Contains("no-such-file"));
  }

  SECTION("a missing bucket and a server gone are named") {
    S3Client other("no-such-bucket", options);
    const absl::Status status = other.PutObject("x", "y");
    CHECK(!status.ok());
    CHECK(absl::IsFailedPrecondition(status));
    CHECK_THAT(std::string(status.message()),
               Catch::Contains("s3://no-such-bucket/x") && Catch::Contains("does not exist"));
    REQUIRE(server.process().Stop(SIGKILL, absl::Seconds(10)).has_value());
    options.attempts = 2;
    const absl::Status gone = S3Client("rlhfd-ckpt", options).PutObject("x", "y");
    CHECK(absl::IsUnavailable(gone));
    CHECK_THAT(std::string(gone.message()), Catch::Contains("PUT s3://rlhfd-ckpt/x"));
  }
}

}  // namespace rlhfd::net
