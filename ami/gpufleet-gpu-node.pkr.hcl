# A GPU node AMI with the gpufleet publisher installed, on one of two Amazon Linux 2023 bases:
#   base=eks   (default) the EKS-optimized accelerated AMI, for EKS managed node groups
#   base=dlami the Deep Learning Base OSS Nvidia Driver GPU AMI, for plain Auto Scaling groups
#   packer init . && packer build -var region=eu-west-1 -var kubernetes_version=1.33 .
#   packer init . && packer build -var region=eu-west-1 -var base=dlami .
# Never built in this repository's CI (no AWS account): tests/test_ami_packer.py parses it (python-hcl2) and
# checks the provisioners against install.sh; ami/README.md says what that covers.
packer {
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = ">= 1.3.0"
    }
  }
}

variable "region" {
  type = string
}

variable "kubernetes_version" {
  type    = string
  default = "1.33"
}

variable "instance_type" {
  type    = string
  default = "g5.xlarge"
}

variable "architecture" {
  type    = string
  default = "x86_64"
}

variable "base" {
  type    = string
  default = "eks"
  validation {
    condition     = contains(["eks", "dlami"], var.base)
    error_message = "The base is eks (EKS managed node groups) or dlami (plain Auto Scaling groups)."
  }
}

locals {
  dlami_arch = var.architecture == "arm64" ? "ARM64 " : ""
  source_name = {
    eks   = "amazon-eks-node-al2023-${var.architecture}-nvidia-${var.kubernetes_version}-*"
    dlami = "Deep Learning ${local.dlami_arch}Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023) *"
  }
}

source "amazon-ebs" "gpu_node" {
  region        = var.region
  instance_type = var.instance_type
  ssh_username  = "ec2-user"
  ami_name      = "gpufleet-${var.base}-${var.base == "eks" ? var.kubernetes_version : "asg"}-al2023-nvidia-${formatdate("YYYYMMDDhhmm", timestamp())}"

  source_ami_filter {
    owners      = ["amazon"]
    most_recent = true
    filters = {
      name                = local.source_name[var.base]
      virtualization-type = "hvm"
      root-device-type    = "ebs"
    }
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required" # IMDSv2 only, as the publisher expects
    http_put_response_hop_limit = 2
    instance_metadata_tags      = "enabled"
  }

  tags = {
    "gpufleet:component" = "gpu-node-ami"
  }
}

build {
  sources = ["source.amazon-ebs.gpu_node"]

  provisioner "shell" {
    inline = ["mkdir -p /tmp/gpufleet/ami /tmp/gpufleet/layers"]
  }

  provisioner "file" {
    source      = "${path.root}/../layers/node"
    destination = "/tmp/gpufleet/layers"
  }

  provisioner "file" {
    sources = [
      "${path.root}/install.sh",
      "${path.root}/gpufleet-publisher.service",
      "${path.root}/gpufleet-podresources-access.path",
      "${path.root}/gpufleet-podresources-access.service",
      "${path.root}/publisher.json",
    ]
    destination = "/tmp/gpufleet/ami/"
  }

  provisioner "shell" {
    inline = [
      "sudo dnf install -y python3-pip",
      "sudo bash /tmp/gpufleet/ami/install.sh --source /tmp/gpufleet/layers/node",
      "rm -rf /tmp/gpufleet",
    ]
  }
}
